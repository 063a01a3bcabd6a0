//! `--state-dtype bf16`: the recurrent states kept in bf16 in the pool (rounded where a step or
//! pass leaves them, computed in f32), on every fixture against the same model with f32 states
//! and against its library's goldens.

use candle_core::{DType, Device};
use deltaserve_engine::{Engine, LoadOptions, Logits};
use deltaserve_kernels::ops::PrefillAlgo;
use deltaserve_tests::{golden_cases, model_fixtures, rel_err, values};

/// The top-2 margin from which a bf16 state's greedy token must be the golden one. A bf16 state
/// moves the logits by ~1e-3 relative (printed below), so the goldens' 1e-3 margin for f32
/// would test the rounding's luck, not the kernels.
const STATE_GREEDY_MARGIN: f64 = 5e-2;

/// Each fixture's prompts, then decode steps along the goldens' greedy continuation (each step
/// fed the golden token), on the f32 model with f32 states (the reference: within 1e-4 of the
/// library, `gpu_models_match_cpu_and_goldens`) and on the f32 and bf16 models with f32 and with
/// bf16 states:
/// - a prompt's logits are the same bits with either state type: a pass keeps its state in f32
///   registers and rounds only what it stores;
/// - f32 model: bf16 states stay within the bf16 model bound of the reference, and pick the
///   golden token wherever its margin is at least [`STATE_GREEDY_MARGIN`];
/// - bf16 model: bf16 states at most double the model's own distance from the reference over
///   the steps (or stay within its bf16 bound).
pub fn gpu_bf16_states_follow_the_goldens(dev: &Device) {
    for (name, dir, goldens, _) in model_fixtures("gpu_bf16_states_follow_the_goldens") {
        let load = |dtype, state_dtype, prefill_algo| {
            let opts = LoadOptions {
                dtype,
                state_dtype,
                device: dev.clone(),
                prefill_algo,
                cuda_graphs: true,
                ..LoadOptions::cpu(dir.to_str().unwrap())
            };
            Engine::load(&opts).unwrap()
        };
        let reference = load(DType::F32, DType::F32, PrefillAlgo::Chunked);
        for (dtype, algo) in [(DType::F32, PrefillAlgo::Chunked), (DType::BF16, PrefillAlgo::ChunkedBf16)] {
            let (full, half) = (load(dtype, DType::F32, algo), load(dtype, DType::BF16, algo));
            let mut pools = [reference.new_pool(1).unwrap(), full.new_pool(1).unwrap(), half.new_pool(1).unwrap()];
            let engines = [&reference, &full, &half];
            let (mut checked, mut steps) = (0, 0);
            for (i, case) in golden_cases(&goldens).iter().enumerate() {
                let slots: Vec<_> = pools.iter_mut().map(|p| p.allocate().unwrap()).collect();
                let mut logits: Vec<Vec<f32>> =
                    (0..3).map(|e| values(&engines[e].prefill(&mut pools[e], slots[e], &case.input_ids, Logits::Last).unwrap())).collect();
                assert!(logits[2] == logits[1], "{name} {dtype:?} case{i}: a prompt's logits depend on the states' storage");
                let (mut e_full, mut e_half, mut greedy) = (0f64, 0f64, true);
                for (step, (&want, &margin)) in case.greedy_new_ids.iter().zip(&case.top2_margins).enumerate() {
                    greedy &= margin >= STATE_GREEDY_MARGIN;
                    if greedy && dtype == DType::F32 {
                        let got = deltaserve_engine::sampling::argmax(&logits[2]);
                        assert_eq!(got, want, "{name} case{i}: greedy step {step} with bf16 states (margin {margin:.3})");
                        checked += 1;
                    }
                    for e in 0..3 {
                        logits[e] = values(&engines[e].decode(&mut pools[e], &[(slots[e], want)]).unwrap().squeeze(0).unwrap());
                    }
                    e_full = e_full.max(rel_err(&logits[1], &logits[0]));
                    e_half = e_half.max(rel_err(&logits[2], &logits[0]));
                    steps += 1;
                }
                let bound = match dtype {
                    DType::F32 => super::BF16_TOL,
                    _ => (2.0 * e_full).max(super::bf16_bound(&name, &goldens, i)),
                };
                println!("{name} {dtype:?} case{i}: decode steps against f32 states of the f32 model: f32 states {e_full:.2e}, bf16 states {e_half:.2e} (bound {bound:.2e})");
                assert!(e_half <= bound, "{name} {dtype:?} case{i}: bf16 states {e_half:.3e} (bound {bound:.2e})");
                for (p, s) in pools.iter_mut().zip(slots) {
                    p.release(s).unwrap();
                }
            }
            println!("{name} {dtype:?}: {steps} decode steps, {checked} greedy tokens checked with bf16 states");
            if dtype == DType::F32 {
                assert!(checked > 0, "{name}: no greedy step above a margin of {STATE_GREEDY_MARGIN}");
            }
        }
    }
}

//! The serving script (tests/common's `serving_script`: a chunked prefill with a snapshot, a
//! restore, a fork, decode steps eager and from CUDA graphs, a mixed pass, a save and a greedy
//! continuation) on one GPU against the CPU, every fixture family.

use candle_core::{DType, Device};
use deltaserve_engine::{Engine, LoadOptions, PrefillAlgo};
use deltaserve_tests::{compact_dir, rel_err, serving_script, top2_margin, GREEDY_MARGIN, SERVING_SCRIPT_GREEDY};

fn load(name: &str, cuda: bool) -> Engine {
    let dir = compact_dir().join(name);
    let mut opts = LoadOptions { dtype: DType::F32, prefill_algo: PrefillAlgo::Chunked, ..LoadOptions::cpu(dir.to_str().unwrap()) };
    if cuda {
        opts.device = deltaserve_engine::parse_device("cuda").unwrap();
    }
    Engine::load(&opts).unwrap_or_else(|e| panic!("{name} (cuda {cuda}): {e}"))
}

/// f32 models: each call's logits within 1e-4 of the CPU's, and the greedy continuation's
/// tokens equal while the CPU's top-2 margin is at least `GREEDY_MARGIN`.
pub(crate) fn gpu_serving_script_matches_cpu(_dev: &Device) {
    for name in ["gdn", "gdp", "gdn-attn", "qwen3_5", "qwen3_next", "qwen3_5_moe"] {
        let (gpu, cpu) = (serving_script(&load(name, true)), serving_script(&load(name, false)));
        assert_eq!(gpu.len(), cpu.len(), "{name}: calls");
        let calls = cpu.len() - SERVING_SCRIPT_GREEDY;
        let mut worst: f64 = 0.0;
        for (i, (g, c)) in gpu[..calls].iter().zip(&cpu[..calls]).enumerate() {
            let e = rel_err(g, c);
            assert!(e <= 1e-4, "{name}: call {i}: logits rel err {e:.3e} against the CPU");
            worst = worst.max(e);
        }
        let mut equal = 0;
        for (g, c) in gpu[calls..].iter().zip(&cpu[calls..]) {
            let top2 = f64::from(top2_margin(c));
            if top2 < GREEDY_MARGIN {
                break;
            }
            let am = |r: &[f32]| deltaserve_engine::sampling::argmax(r);
            assert_eq!(am(g), am(c), "{name}: greedy token {equal} differs (margin {top2:.2e})");
            equal += 1;
        }
        println!(
            "serving script {name} f32: {calls} calls within {worst:.2e} of the CPU; greedy {equal}/{SERVING_SCRIPT_GREEDY} tokens equal"
        );
    }
}

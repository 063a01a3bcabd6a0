//! Model-level parity with fla's goldens, for every case of every model fixture: last-token
//! logits, all-position logits of the long case, and greedy generation through the cache.

use deltaserve_engine::{Engine, LoadOptions, Logits, PrefillAlgo};
use deltaserve_tests::{check_greedy, golden_cases, load_tensors, model_fixtures, rel_err, values};

const LOGITS_TOL: f64 = 1e-4;
/// fla's bound for bf16 computation on `last_logits`.
const BF16_TOL: f64 = 2e-2;
/// Greedy tokens must agree up to the first step whose top-2 margin is below this.

#[test]
fn logits_and_greedy_tokens_match_goldens() {
    for (name, dir, goldens, logits_file) in model_fixtures("logits_and_greedy_tokens_match_goldens") {
        let engine = Engine::load(&LoadOptions::cpu(dir.to_str().unwrap())).unwrap();
        let reference = load_tensors(&logits_file);
        let mut pool = engine.new_pool(1).unwrap();
        for (i, case) in golden_cases(&goldens).iter().enumerate() {
            let ids: Vec<i64> = values(&reference[&format!("case{i}.input_ids")]).iter().map(|&x| x as i64).collect();
            assert_eq!(ids, case.input_ids.iter().map(|&x| x as i64).collect::<Vec<_>>(), "{name} case{i}: ids");
            // The prompt text tokenizes to the goldens' ids (BOS included). Long cases name
            // their text by a `<placeholder>` instead of giving it.
            let placeholder = case.prompt.starts_with('<') && case.prompt.ends_with('>');
            assert!(placeholder || engine.encode(&case.prompt).unwrap() == case.input_ids, "{name} case{i}: tokenizer");

            let slot = pool.allocate().unwrap();
            if let Some(all_ref) = reference.get(&format!("case{i}.all_logits")) {
                let all = engine.prefill(&mut pool, slot, &case.input_ids, Logits::All).unwrap();
                let e = rel_err(&values(&all), &values(all_ref));
                println!("{name} case{i}: all_logits rel err {e:.2e}");
                assert!(e <= LOGITS_TOL, "{name} case{i}: all_logits rel err {e:.3e}");
                pool.release(slot).unwrap();
            } else {
                pool.release(slot).unwrap();
            }
            let slot = pool.allocate().unwrap();
            let last = engine.prefill(&mut pool, slot, &case.input_ids, Logits::Last).unwrap();
            let e = rel_err(&values(&last), &values(&reference[&format!("case{i}.last_logits")]));
            println!("{name} case{i}: last_logits rel err {e:.2e}");
            assert!(e <= LOGITS_TOL, "{name} case{i}: last_logits rel err {e:.3e}");

            // Greedy through prefill + batched decode of one slot.
            check_greedy(&format!("{name} case{i}"), case, last, |t| engine.decode(&mut pool, &[(slot, t)]).unwrap().squeeze(0).unwrap());
            pool.release(slot).unwrap();
        }
    }
}

/// `--mixer-precision bf16` on the CPU (the mixer on bf16-rounded q, k, v): last-token logits
/// stay within the bf16 bound of fla's goldens, and the rounding is really applied (the result
/// moves away from the near-fp32 one).
#[test]
fn bf16_mixer_precision_stays_within_the_bf16_bound() {
    for (name, dir, goldens, logits_file) in model_fixtures("bf16_mixer_precision_stays_within_the_bf16_bound") {
        let load = |prefill_algo| Engine::load(&LoadOptions { prefill_algo, ..LoadOptions::cpu(dir.to_str().unwrap()) }).unwrap();
        let (exact, rounded) = (load(PrefillAlgo::Chunked), load(PrefillAlgo::ChunkedBf16));
        let reference = load_tensors(&logits_file);
        let (mut pe, mut pr) = (exact.new_pool(1).unwrap(), rounded.new_pool(1).unwrap());
        for (i, case) in golden_cases(&goldens).iter().enumerate() {
            let (se, sr) = (pe.allocate().unwrap(), pr.allocate().unwrap());
            let le = values(&exact.prefill(&mut pe, se, &case.input_ids, Logits::Last).unwrap());
            let lr = values(&rounded.prefill(&mut pr, sr, &case.input_ids, Logits::Last).unwrap());
            let golden = values(&reference[&format!("case{i}.last_logits")]);
            let (e, moved) = (rel_err(&lr, &golden), rel_err(&lr, &le));
            println!("{name} case{i}: bf16 mixer vs fla {e:.2e} (vs the fp32 mixer {moved:.2e})");
            assert!(e <= BF16_TOL, "{name} case{i}: bf16 mixer rel err {e:.3e}");
            assert!(moved > 0.0, "{name} case{i}: bf16 rounding had no effect");
            pe.release(se).unwrap();
            pr.release(sr).unwrap();
        }
    }
}

//! The prefix cache changes no bits (CPU, f32): a prompt continued from a snapshot taken
//! inside an earlier prompt's prefill (alone, or in a mixed pass beside a decode row) gives the
//! logits of the prompt prefilled whole, for every family (the hybrids' KV blocks shared, not
//! copied). The GPU's counterpart is in gpu.rs; the
//! server's use of the cache is tested in http_in_process.rs.

use candle_core::{DType, Device};
use deltaserve_engine::PrefillAlgo;
use deltaserve_tests::prefix::cached_against_whole;
use deltaserve_tests::{compact_model, COMPACT_MODELS};

#[test]
fn prompts_continued_from_snapshots_give_the_bits_of_whole_prefills() {
    for (i, name) in COMPACT_MODELS.iter().enumerate() {
        let m = compact_model(name, DType::F32, &Device::Cpu);
        for beside_decode in [false, true] {
            let cases = cached_against_whole(&m, 40 + i as u64, PrefillAlgo::Chunked, beside_decode);
            assert_eq!(cases.len(), 8, "{name}: every prompt finds a snapshot");
            for (case, cached, whole) in &cases {
                for (step, (a, b)) in cached.iter().zip(whole).enumerate() {
                    let differ = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                    assert_eq!(differ, 0, "{name} (snapshots in a mixed pass: {beside_decode}): {case}, step {step}: {differ} differ");
                }
            }
            println!("{name}: {} cases bit-identical (snapshots in a mixed pass: {beside_decode})", cases.len());
        }
    }
}

//! A sequence's logits are the same bits whatever else is in its batch (CPU, f32): alone or in
//! decode batches of 2, 7 and 32, in any slot and batch row, prefilled alone or packed with
//! other prompts, prefilled or decoded in mixed passes (prompt rows and decode rows together),
//! and with its prompt split at the prefill's chunk boundaries (how the server shares its
//! per-step token budget). The GPU's counterpart (`--batch-invariant`) is in gpu.rs.

use candle_core::{DType, Device};
use deltaserve_engine::PrefillAlgo;
use deltaserve_tests::invariance::{batch_differences, mixed_differences};
use deltaserve_tests::{compact_model, COMPACT_MODELS};

#[test]
fn logits_are_bit_identical_alone_in_batches_of_2_7_and_32_and_split_at_chunks() {
    for (i, name) in COMPACT_MODELS.iter().enumerate() {
        let m = compact_model(name, DType::F32, &Device::Cpu);
        let cases = batch_differences(&m, 19 + i as u64);
        for (case, differ) in &cases {
            assert_eq!(*differ, 0, "{name}: {case}: {differ} logits differ from the sequence alone");
        }
        println!("{name}: {} cases bit-identical to alone", cases.len());
    }
}

/// With the bf16 mixer (`--mixer-precision bf16`), whose prompt rows leave the mixer in bf16 and
/// are widened to the decode rows' f32 in a mixed pass: a sequence prefilled and decoded in mixed
/// passes gives the bits it gives alone.
#[test]
fn bf16_mixer_mixed_passes_are_bit_identical_to_alone() {
    for (i, name) in COMPACT_MODELS.iter().enumerate() {
        let m = compact_model(name, DType::F32, &Device::Cpu);
        let differ = mixed_differences(&m, 23 + i as u64, PrefillAlgo::ChunkedBf16);
        assert!(!differ.is_empty(), "{name}: nothing compared");
        assert!(differ.iter().all(|d| *d == 0), "{name}: logits differing from alone, per step: {differ:?}");
        println!("{name}: bf16 mixer, {} steps in mixed passes bit-identical to alone", differ.len());
    }
}

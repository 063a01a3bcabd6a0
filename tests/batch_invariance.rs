//! A sequence's logits are the same bits whatever else is in its batch (CPU, f32): alone or in
//! decode batches of 2, 7 and 32, in any slot and batch row, prefilled alone or packed with
//! other prompts, prefilled or decoded in mixed passes (prompt rows and decode rows together),
//! and with its prompt split at the prefill's chunk boundaries (how the server shares its
//! per-step token budget). The GPU's counterpart (`--batch-invariant`) is in gpu.rs.

use candle_core::{DType, Device};
use deltaserve_tests::invariance::batch_differences;
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

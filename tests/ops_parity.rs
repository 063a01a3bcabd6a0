//! Op-level parity with fla's float64 naive recurrence (`ops.safetensors`): the gated delta
//! rule (`gdr`), with negative eigenvalues (`gdr_neg`) and the gated delta product (`gdp`),
//! through both the chunked and the recurrent path, with initial and final state.

use deltaserve_kernels::ops::{gated_delta_prefill, PrefillAlgo};
use deltaserve_kernels::SlotBuffer;
use deltaserve_tests::{check_op_case, compact_dir, shared_dir, values};

const TOL: f64 = 1e-5;

/// Runs one op case on the CPU from a one-slot state buffer holding h0.
fn check(file: &std::path::Path, case: &str, algo: PrefillAlgo) -> (f64, f64) {
    check_op_case(file, case, |inputs, h0| {
        let mut states = SlotBuffer::zeros(1, h0.len());
        states.slot_mut(0).unwrap().copy_from_slice(&h0);
        let o = gated_delta_prefill(inputs, &mut states, 0, algo).unwrap();
        (values(&o), states.slot_to_vec(0).unwrap())
    })
}

fn check_file(file: &std::path::Path) {
    for case in ["gdr", "gdr_neg", "gdp"] {
        for algo in [PrefillAlgo::Chunked, PrefillAlgo::Recurrent] {
            let (eo, eh) = check(file, case, algo);
            println!("{} {case} {algo:?}: o rel err {eo:.2e}, ht rel err {eh:.2e}", file.display());
            assert!(eo <= TOL, "{case} {algo:?}: o rel err {eo:.3e} > {TOL}");
            assert!(eh <= TOL, "{case} {algo:?}: ht rel err {eh:.3e} > {TOL}");
        }
    }
}

#[test]
fn compact_ops_match_reference() {
    check_file(&compact_dir().join("ops.safetensors"));
}

#[test]
fn fla_ops_match_reference() {
    if let Some(dir) = shared_dir("fla_ops_match_reference") {
        check_file(&dir.join("ops.safetensors"));
    }
}

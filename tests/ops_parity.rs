//! Op-level parity with fla's float64 naive recurrence (`ops.safetensors`): the gated delta
//! rule (`gdr`), with negative eigenvalues (`gdr_neg`) and the gated delta product (`gdp`),
//! through both the chunked and the recurrent path, with initial and final state.

use candle_core::Tensor;
use deltaserve_kernels::ops::{gated_delta_prefill, MixerInputs, PrefillAlgo};
use deltaserve_tests::{compact_dir, load_tensors, rel_err, shared_dir, values};

const TOL: f64 = 1e-5;

/// Runs one op case for every batch element; returns the worst (o, ht) errors.
fn check(file: &std::path::Path, case: &str, algo: PrefillAlgo) -> (f64, f64) {
    let t = load_tensors(file);
    let inp = if case == "gdr_neg" { "gdr" } else { case };
    let get = |k: &str| t.get(k).unwrap_or_else(|| panic!("missing {k}")).clone();
    let (q, k, v, g, h0) =
        (get(&format!("{inp}.q")), get(&format!("{inp}.k")), get(&format!("{inp}.v")), get(&format!("{inp}.g")), get(&format!("{inp}.h0")));
    let (beta, o_ref, ht_ref) = (get(&format!("{case}.beta")), get(&format!("{case}.o")), get(&format!("{case}.ht")));
    let (b, tq, _, kd) = q.dims4().unwrap();
    let n = k.dim(1).unwrap() / tq;
    let scale = (kd as f32).powf(-0.5);
    let (mut worst_o, mut worst_h) = (0f64, 0f64);
    for bi in 0..b {
        let sel = |x: &Tensor| x.get(bi).unwrap();
        let mut state = values(&sel(&h0));
        let o = gated_delta_prefill(
            MixerInputs { q: &sel(&q), k: &sel(&k), v: &sel(&v), beta: &sel(&beta), g: Some(&sel(&g)), n, scale },
            &mut state,
            algo,
        )
        .unwrap();
        worst_o = worst_o.max(rel_err(&values(&o), &values(&sel(&o_ref))));
        worst_h = worst_h.max(rel_err(&state, &values(&sel(&ht_ref))));
    }
    (worst_o, worst_h)
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

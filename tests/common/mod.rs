//! Helpers shared by the integration tests: fixture locations and error measures.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

/// This package's directory: `DELTASERVE_TESTS_DIR` when set (a test binary run on another
/// machine, e.g. the GPU host), else where it was built.
pub fn tests_dir() -> PathBuf {
    std::env::var_os("DELTASERVE_TESTS_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// The committed compact fixtures (always present).
pub fn compact_dir() -> PathBuf {
    tests_dir().join("fixtures/compact")
}

/// The full fla-made fixtures at `../shared/fixtures` beside the repository (or at
/// `DELTASERVE_SHARED_FIXTURES`), if present. When absent, prints a visible notice naming the
/// test that could not use them.
pub fn shared_dir(test: &str) -> Option<PathBuf> {
    let dir =
        std::env::var_os("DELTASERVE_SHARED_FIXTURES").map(PathBuf::from).unwrap_or_else(|| tests_dir().join("../../shared/fixtures"));
    if dir.join("README.md").exists() {
        Some(dir)
    } else {
        eprintln!("NOTICE: {test}: ../shared/fixtures not found; only the compact fixtures were checked");
        None
    }
}

/// Loads every tensor of a safetensors file.
pub fn load_tensors(path: &Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(path, &Device::Cpu).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Flattens a tensor to f32 values.
pub fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(candle_core::DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

/// ‖a − b‖ / ‖b‖ in f64.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum::<f64>().sqrt();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum::<f64>().sqrt();
    num / den.max(1e-30)
}

/// One model case of a `NAME.goldens.json`.
#[derive(Debug, Clone)]
pub struct GoldenCase {
    /// Prompt ids including BOS.
    pub input_ids: Vec<u32>,
    /// Greedy continuation.
    pub greedy_new_ids: Vec<u32>,
    /// Top-2 logit gap at each greedy step.
    pub top2_margins: Vec<f64>,
    /// The prompt text.
    pub prompt: String,
}

/// Reads the cases of a goldens file.
pub fn golden_cases(path: &Path) -> Vec<GoldenCase> {
    let text = std::fs::read_to_string(path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |x: &serde_json::Value| x.as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect::<Vec<_>>();
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| GoldenCase {
            input_ids: ids(&c["input_ids"]),
            greedy_new_ids: ids(&c["greedy_new_ids"]),
            top2_margins: c["top2_margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect(),
            prompt: c["prompt"].as_str().unwrap_or_default().to_owned(),
        })
        .collect()
}

/// One op case of an `ops.safetensors` file (fla's float64 naive recurrence), batch element by
/// batch element: `run(inputs, h0)` must return `(o, ht)`. Returns the worst (o, ht) errors.
/// Cases: `gdr`, `gdr_neg` (negative eigenvalues) and `gdp` (gated delta product).
pub fn check_op_case(
    file: &Path,
    case: &str,
    mut run: impl FnMut(deltaserve_kernels::ops::MixerInputs<'_>, Vec<f32>) -> (Vec<f32>, Vec<f32>),
) -> (f64, f64) {
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
        let inputs =
            deltaserve_kernels::ops::MixerInputs { q: &sel(&q), k: &sel(&k), v: &sel(&v), beta: &sel(&beta), g: Some(&sel(&g)), n, scale };
        let (o, ht) = run(inputs, values(&sel(&h0)));
        worst_o = worst_o.max(rel_err(&o, &values(&sel(&o_ref))));
        worst_h = worst_h.max(rel_err(&ht, &values(&sel(&ht_ref))));
    }
    (worst_o, worst_h)
}

/// Every model fixture: (name, checkpoint dir, goldens json, logits safetensors).
pub fn model_fixtures(test: &str) -> Vec<(String, PathBuf, PathBuf, PathBuf)> {
    let c = compact_dir();
    let mut v: Vec<_> = ["gdn", "gdn-gva", "gdp"]
        .iter()
        .map(|n| (format!("compact/{n}"), c.join(n), c.join(format!("{n}.goldens.json")), c.join(format!("{n}.logits.safetensors"))))
        .collect();
    if let Some(s) = shared_dir(test) {
        for n in ["tiny-gdn", "tiny-gdp"] {
            v.push((n.to_string(), s.join(n), s.join(format!("{n}.goldens.json")), s.join(format!("{n}.logits.safetensors"))));
        }
    }
    v
}

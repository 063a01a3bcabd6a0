//! Helpers shared by the integration tests: fixture locations and error measures.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

/// The committed compact fixtures (always present).
pub fn compact_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/compact")
}

/// The full fla-made fixtures at `../shared/fixtures` beside the repository, if present.
/// When absent, prints a visible notice naming the test that could not use them.
pub fn shared_dir(test: &str) -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures");
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

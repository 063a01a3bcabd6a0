//! Randomly initialised checkpoints in fla's exact layout, for tests and benchmarks of
//! realistic shapes (`deltaserve init-random`).

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::inventory::expected_tensors;

fn io_err(path: &Path, e: impl ToString) -> EngineError {
    EngineError::Io { path: path.to_path_buf(), message: e.to_string() }
}

/// Standard normal samples (Box–Muller).
fn normals(rng: &mut ChaCha20Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u1: f32 = rng.random::<f32>().max(1e-12);
            let u2: f32 = rng.random();
            (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
        })
        .collect()
}

/// Values for one tensor, scaled so activations stay O(1) through the depth.
fn init(rng: &mut ChaCha20Rng, key: &str, shape: &[usize]) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let z = normals(rng, n);
    if key.ends_with("A_log") {
        // A ∈ [1, 16) as fla's init.
        return (0..n).map(|_| (1.0 + 15.0 * rng.random::<f32>()).ln()).collect();
    }
    if key.ends_with("dt_bias") {
        return z.iter().map(|x| 0.5 * x - 2.0).collect();
    }
    if key.ends_with("norm.weight") {
        return z.iter().map(|x| 1.0 + 0.1 * x).collect();
    }
    if key.contains("conv1d") {
        let w = *shape.last().unwrap_or(&1) as f32;
        return z.iter().map(|x| x / w.sqrt()).collect();
    }
    if key.ends_with("embeddings.weight") {
        return z;
    }
    let fan_in = *shape.last().unwrap_or(&1) as f32;
    z.iter().map(|x| x / fan_in.sqrt()).collect()
}

/// Writes `config.json` and a random `model.safetensors` (in `dtype`) for `config` into `dir`.
/// Tokenizer files from `tokenizer_from` are copied when given.
pub fn write_random_checkpoint(config: &Value, dir: &Path, dtype: DType, seed: u64, tokenizer_from: Option<&Path>) -> Result<ModelConfig> {
    let cfg = ModelConfig::from_value(config.clone())?;
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut tensors = Vec::new();
    for (key, shape) in expected_tensors(&cfg) {
        let t = Tensor::from_vec(init(&mut rng, &key, &shape), shape.as_slice(), &Device::Cpu)?.to_dtype(dtype)?;
        tensors.push((key, t));
    }
    let path = dir.join(crate::weights::SINGLE_FILE);
    candle_core::safetensors::save(&tensors.into_iter().collect(), &path)?;
    let cfg_path = dir.join("config.json");
    std::fs::write(&cfg_path, serde_json::to_string_pretty(config).map_err(|e| io_err(&cfg_path, e))?).map_err(|e| io_err(&cfg_path, e))?;
    if let Some(src) = tokenizer_from {
        for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
            if src.join(f).exists() {
                std::fs::copy(src.join(f), dir.join(f)).map_err(|e| io_err(&src.join(f), e))?;
            }
        }
    }
    Ok(cfg)
}

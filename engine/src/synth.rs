//! Randomly initialised checkpoints in fla's exact layout, for tests and benchmarks of
//! realistic shapes (`deltaserve init-random`).

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rayon::prelude::*;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::inventory::expected_tensors;

fn io_err(path: &Path, e: impl ToString) -> EngineError {
    EngineError::Io { path: path.to_path_buf(), message: e.to_string() }
}

/// Elements one rayon task draws: each task seeks its own copy of the stream to its first word,
/// so the values are those of one sequential pass whatever the thread count.
const CHUNK: usize = 1 << 18;

/// One ChaCha20 stream shared by every tensor: a tensor's values start at the word where the
/// previous tensor's stopped. Every `f32` draw consumes exactly one 32-bit word.
struct Stream {
    base: ChaCha20Rng,
    word: u128,
}

impl Stream {
    fn new(seed: u64) -> Self {
        Self { base: ChaCha20Rng::seed_from_u64(seed), word: 0 }
    }

    /// `n` values, value i drawn by `f` from words `word + w·i ..`, `w` words each.
    fn draw(&mut self, n: usize, w: usize, f: impl Fn(&mut ChaCha20Rng) -> f32 + Sync) -> Vec<f32> {
        let mut out = vec![0f32; n];
        let (base, start) = (&self.base, self.word);
        out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, dst)| {
            let mut rng = base.clone();
            rng.set_word_pos(start + (w * c * CHUNK) as u128);
            dst.iter_mut().for_each(|v| *v = f(&mut rng));
        });
        self.word += (w * n) as u128;
        out
    }

    /// Standard normal samples (Box–Muller, two words each).
    fn normals(&mut self, n: usize) -> Vec<f32> {
        self.draw(n, 2, |rng| {
            let u1: f32 = rng.random::<f32>().max(1e-12);
            let u2: f32 = rng.random();
            (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
        })
    }
}

/// Values for one tensor, scaled so activations stay O(1) through the depth; `zero_centred`:
/// the family's decoder norms are x̂·(1 + w).
fn init(rng: &mut Stream, key: &str, shape: &[usize], zero_centred: bool) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let z = rng.normals(n);
    if key.ends_with("A_log") {
        // A ∈ [1, 16) as fla's init.
        return rng.draw(n, 1, |r| (1.0 + 15.0 * r.random::<f32>()).ln());
    }
    let scale = |s: f32, b: f32| z.par_iter().map(|x| s * x + b).collect::<Vec<f32>>();
    if key.ends_with("dt_bias") {
        return scale(0.5, -2.0);
    }
    if key.ends_with("norm.weight") {
        // Qwen's decoder norms store w of x̂·(1 + w); its GDN output norm is plain.
        let zero_centred = zero_centred && !key.contains("linear_attn.norm");
        return scale(0.1, if zero_centred { 0.0 } else { 1.0 });
    }
    if key.contains("conv1d") {
        let w = *shape.last().unwrap_or(&1) as f32;
        return z.par_iter().map(|x| x / w.sqrt()).collect();
    }
    if key.ends_with("embeddings.weight") {
        return z;
    }
    let fan_in = *shape.last().unwrap_or(&1) as f32;
    z.par_iter().map(|x| x / fan_in.sqrt()).collect()
}

/// Writes `config.json` and a random `model.safetensors` (in `dtype`) for `config` into `dir`:
/// fla's layouts and transformers' (Qwen3.5 and Qwen3.5-MoE in their text layouts, Qwen3-Next,
/// OLMo-Hybrid), as [`expected_tensors`] lists them.
/// Tokenizer files from `tokenizer_from` are copied when given.
pub fn write_random_checkpoint(config: &Value, dir: &Path, dtype: DType, seed: u64, tokenizer_from: Option<&Path>) -> Result<ModelConfig> {
    let cfg = ModelConfig::from_value(config.clone())?;
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let mut rng = Stream::new(seed);
    let mut tensors = Vec::new();
    for (key, shape) in expected_tensors(&cfg) {
        let values = init(&mut rng, &key, &shape, cfg.family.zero_centred());
        let t = Tensor::from_vec(values, shape.as_slice(), &Device::Cpu)?.to_dtype(dtype)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunked, seeking draw against one plain sequential pass over the same stream, across
    /// chunk boundaries and from an offset a previous tensor left.
    #[test]
    fn parallel_draws_equal_one_sequential_pass() {
        let n = 2 * CHUNK + 77;
        let mut seq = ChaCha20Rng::seed_from_u64(9);
        let mut expect = Vec::new();
        for m in [5, n] {
            for _ in 0..m {
                let u1: f32 = seq.random::<f32>().max(1e-12);
                let u2: f32 = seq.random();
                expect.push((-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos());
            }
        }
        for _ in 0..n {
            expect.push((1.0 + 15.0 * seq.random::<f32>()).ln());
        }
        // Normals of a 5-element tensor, then an A_log tensor of n: n normals (discarded by
        // `init`) and n uniforms.
        let mut s = Stream::new(9);
        let mut all = s.normals(5);
        all.extend(s.normals(n));
        let mut s2 = Stream::new(9);
        s2.normals(5);
        all.extend(init(&mut s2, "layers.0.attn.A_log", &[n], false));
        assert_eq!(all.len(), expect.len());
        for (i, (a, b)) in all.iter().zip(&expect).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "value {i}");
        }
    }
}

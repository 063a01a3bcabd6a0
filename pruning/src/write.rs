//! Writes the pruned checkpoint: sliced q/k projections and convs, everything else
//! byte-for-byte, a config stock fla loads (pruning-spec.md §3), and the tokenizer files.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use deltaserve_engine::weights::Checkpoint;
use deltaserve_engine::ModelConfig;
use serde_json::Value;

use crate::methods::Selection;
use crate::PruneError;

/// Files copied unchanged next to the weights.
const SIDE_FILES: &[&str] = &["tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json"];

/// `expand_v` such that `int(k · expand_v) == head_v_dim` in IEEE doubles (§3.3's float fix).
pub fn expand_v_for(head_v_dim: usize, k: usize) -> f64 {
    let mut e = head_v_dim as f64 / k as f64;
    while ((k as f64) * e) as usize != head_v_dim {
        e = f64::from_bits(e.to_bits() + 1);
    }
    e
}

/// The global row indices of `q_proj` (and one k block) for a layer's selection.
fn q_rows(sel: &[Vec<usize>], d: usize) -> Vec<u32> {
    sel.iter().enumerate().flat_map(|(h, idx)| idx.iter().map(move |&c| (h * d + c) as u32)).collect()
}

/// Rows of `k_proj` / `k_conv1d`: the q rows in every householder block, j-major.
fn k_rows(sel: &[Vec<usize>], d: usize, key_dim: usize, n: usize) -> Vec<u32> {
    let q = q_rows(sel, d);
    (0..n).flat_map(|j| q.iter().map(move |&r| r + (j * key_dim) as u32)).collect()
}

/// Which pruned tensor a key names, if any: `(layer, is_key_side)`.
fn sliced(key: &str, layers: usize) -> Option<(usize, bool)> {
    let rest = key.strip_prefix("model.layers.")?;
    let (layer, name) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    if layer >= layers {
        return None;
    }
    match name {
        "attn.q_proj.weight" | "attn.q_conv1d.weight" => Some((layer, false)),
        "attn.k_proj.weight" | "attn.k_conv1d.weight" => Some((layer, true)),
        _ => None,
    }
}

/// One head dim for all: every layer has H heads of k distinct channels in `0..d`.
fn validate_selection(sel: &Selection, layers: usize, heads: usize, d: usize, k: usize) -> Result<(), PruneError> {
    let bad = |actual: String| PruneError::Invalid {
        field: "selection",
        expected: format!("{layers} layers × {heads} heads × {k} distinct channels in 0..{d}, k ≥ 1"),
        actual,
    };
    if k == 0 || sel.len() != layers {
        return Err(bad(format!("{} layers, k = {k}", sel.len())));
    }
    for (l, hs) in sel.iter().enumerate() {
        if hs.len() != heads {
            return Err(bad(format!("{} heads in layer {l}", hs.len())));
        }
        for (h, idx) in hs.iter().enumerate() {
            let mut s = idx.clone();
            s.sort_unstable();
            s.dedup();
            if idx.len() != k || s.len() != k || s.last().is_some_and(|&c| c >= d) {
                return Err(bad(format!("layer {l} head {h}: {idx:?}")));
            }
        }
    }
    Ok(())
}

/// Writes `out` from `input` with `sel` kept. Returns the new config.
pub fn write_checkpoint(input: &Path, out: &Path, cfg: &ModelConfig, sel: &Selection) -> Result<ModelConfig, PruneError> {
    let io = |p: &Path, e: std::io::Error| PruneError::Io { path: p.to_path_buf(), message: e.to_string() };
    let k = sel.first().and_then(|l| l.first()).map_or(0, Vec::len);
    let (d, key_dim, n, layers) = (cfg.head_k_dim(), cfg.key_dim(), cfg.num_householder(), cfg.common.num_hidden_layers);
    validate_selection(sel, layers, cfg.num_heads(), d, k)?;
    let ckpt = Checkpoint::open(input)?;
    for name in ["q_conv1ds.0", "k_projs.0"] {
        let legacy = format!("model.layers.0.attn.{name}.weight");
        if ckpt.contains(&legacy) {
            return Err(PruneError::Unsupported(format!("legacy per-step layout (`{legacy}`): load and re-save it with fla ≥ 0.3 first")));
        }
    }
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for key in ckpt.names() {
        let dtype = ckpt.dtype(&key).ok_or_else(|| PruneError::Tensor { tensor: key.clone(), message: "unsupported dtype".into() })?;
        let t = ckpt.load_raw(&key, dtype, &Device::Cpu)?;
        let t = match sliced(&key, layers) {
            Some((l, key_side)) => {
                let rows = if key_side { k_rows(&sel[l], d, key_dim, n) } else { q_rows(&sel[l], d) };
                let idx = Tensor::new(rows.as_slice(), &Device::Cpu)
                    .map_err(|e| PruneError::Tensor { tensor: key.clone(), message: e.to_string() })?;
                t.index_select(&idx, 0).map_err(|e| PruneError::Tensor { tensor: key.clone(), message: e.to_string() })?
            }
            None => t,
        };
        tensors.insert(key, t);
    }
    std::fs::create_dir_all(out).map_err(|e| io(out, e))?;
    let weights = out.join("model.safetensors");
    candle_core::safetensors::save(&tensors, &weights)
        .map_err(|e| PruneError::Tensor { tensor: weights.display().to_string(), message: e.to_string() })?;

    let mut raw = cfg.raw.clone();
    if let Value::Object(m) = &mut raw {
        m.insert("head_dim".into(), Value::from(k));
        m.insert("expand_v".into(), Value::from(expand_v_for(cfg.head_v_dim(), k)));
    }
    let cfg_path = out.join("config.json");
    std::fs::write(&cfg_path, serde_json::to_string_pretty(&raw).unwrap_or_default()).map_err(|e| io(&cfg_path, e))?;
    for f in SIDE_FILES {
        let src = input.join(f);
        if src.exists() {
            std::fs::copy(&src, out.join(f)).map_err(|e| io(&src, e))?;
        }
    }
    Ok(ModelConfig::from_value(raw)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expand_v_survives_truncation() {
        // Cases the spec lists as truncating with the naive quotient.
        for hv in [128usize, 256, 512] {
            for k in 1..=hv {
                let e = expand_v_for(hv, k);
                assert_eq!((k as f64 * e) as usize, hv, "hv {hv} k {k}");
                // And it survives a JSON round trip.
                let back: f64 = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
                assert_eq!(back, e);
            }
        }
    }

    #[test]
    fn gdp_key_rows_are_j_major() {
        let sel = vec![vec![1, 3], vec![0, 2]];
        assert_eq!(q_rows(&sel, 4), vec![1, 3, 4, 6]);
        assert_eq!(k_rows(&sel, 4, 8, 2), vec![1, 3, 4, 6, 9, 11, 12, 14]);
    }
}

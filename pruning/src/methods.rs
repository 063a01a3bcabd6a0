//! Per-head channel selection for each method (pruning-spec.md §2, §7 step 4). One index set
//! per q/k head, shared by q and all n keys (§3.5 for Gated DeltaProduct).

use deltaserve_engine::weights::Checkpoint;
use deltaserve_engine::{DType, Device, ModelConfig, Tensor};
use faer::Mat;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use crate::calibrate::{LayerStats, TaylorSums};
use crate::rrqr::strong_rrqr;
use crate::PruneError;

/// Gu–Eisenstat bound.
pub const RRQR_F: f64 = 1.5;
/// Swap budget after QRCP.
pub const RRQR_MAX_SWAPS: usize = 20;

/// The kept channels: `[layer][head]` → indices in `0..head_dim`.
pub type Selection = Vec<Vec<Vec<usize>>>;

/// Per-head extras a method reports (DRRQR's swaps and final ρ).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct HeadInfo {
    /// Swaps after QRCP.
    pub swaps: usize,
    /// Final max ρ_ij.
    pub max_rho: f64,
    /// Rows of `[Q; K]` the decomposition used.
    pub rows: usize,
}

/// Top-k channel indices by score (ties to the lower index), sorted ascending.
pub fn top_k_sorted(scores: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx.sort_unstable();
    idx
}

/// A seeded random k-subset per head, sorted.
pub fn rand(layers: usize, heads: usize, d: usize, k: usize, seed: u64) -> Selection {
    (0..layers)
        .map(|l| {
            (0..heads)
                .map(|h| {
                    let mut rng = ChaCha20Rng::seed_from_u64(seed.wrapping_add(((l as u64) << 20) | h as u64));
                    let mut idx: Vec<usize> = (0..d).collect();
                    idx.shuffle(&mut rng);
                    idx.truncate(k);
                    idx.sort_unstable();
                    idx
                })
                .collect()
        })
        .collect()
}

/// `|W_q|` and `|W_k|` rows of one layer as f32 `[rows][D]`.
fn abs_rows(ckpt: &Checkpoint, key: &str) -> Result<Vec<Vec<f32>>, PruneError> {
    let t = ckpt.load_raw(key, DType::F32, &Device::Cpu)?;
    rows_of(&t.abs(), key)
}

fn rows_of(t: &candle_core::Result<Tensor>, name: &str) -> Result<Vec<Vec<f32>>, PruneError> {
    let tensor_err = |e: &dyn std::fmt::Display| PruneError::Tensor { tensor: name.into(), message: e.to_string() };
    match t {
        Ok(t) => t.to_vec2::<f32>().map_err(|e| tensor_err(&e)),
        Err(e) => Err(tensor_err(e)),
    }
}

/// Channel scores of one layer from non-negative element scores `q` `[H·K][D]` and `k`
/// `[n·H·K][D]`: Σ_j (q + Σ_n k^(n))_cj · w_j, where `w` is all ones or the mixer-input RMS.
fn channel_scores(cfg: &ModelConfig, q: &[Vec<f32>], k: &[Vec<f32>], weights: Option<&[f64]>) -> Vec<f64> {
    let key_dim = cfg.key_dim();
    let dot = |row: &[f32]| -> f64 {
        match weights {
            Some(w) => row.iter().zip(w).map(|(a, b)| *a as f64 * b).sum(),
            None => row.iter().map(|a| *a as f64).sum(),
        }
    };
    (0..key_dim).map(|c| dot(&q[c]) + (0..cfg.num_householder()).map(|j| dot(&k[j * key_dim + c])).sum::<f64>()).collect()
}

/// Top-k per head of one layer's channel scores.
fn per_head(scores: &[f64], heads: usize, d: usize, k: usize) -> Vec<Vec<usize>> {
    (0..heads).map(|head| top_k_sorted(&scores[head * d..(head + 1) * d], k)).collect()
}

/// L1 (data-free) or S-Wanda (`stats` given) selection.
pub fn by_weights(cfg: &ModelConfig, ckpt: &Checkpoint, k: usize, stats: Option<&[LayerStats]>) -> Result<Selection, PruneError> {
    (0..cfg.common.num_hidden_layers)
        .map(|l| {
            let p = format!("model.layers.{l}.attn");
            let q = abs_rows(ckpt, &format!("{p}.q_proj.weight"))?;
            let kr = abs_rows(ckpt, &format!("{p}.k_proj.weight"))?;
            let rms = stats.map(|s| s[l].rms());
            Ok(per_head(&channel_scores(cfg, &q, &kr, rms.as_deref()), cfg.num_heads(), cfg.head_k_dim(), k))
        })
        .collect()
}

/// Grad: top-k of Σ_j |W ⊙ ΣG| over the q row and every k row of each channel, sorted.
pub fn grad(cfg: &ModelConfig, sums: &TaylorSums, k: usize) -> Result<Selection, PruneError> {
    sums.layers
        .iter()
        .enumerate()
        .map(|(l, [wq, gq, wk, gk])| {
            let q = rows_of(&(wq * gq).and_then(|t| t.abs()), &format!("layer {l} q_proj score"))?;
            let kr = rows_of(&(wk * gk).and_then(|t| t.abs()), &format!("layer {l} k_proj score"))?;
            Ok(per_head(&channel_scores(cfg, &q, &kr, None), cfg.num_heads(), cfg.head_k_dim(), k))
        })
        .collect()
}

/// DRRQR: strong RRQR of each head's sampled `[Q_h; K_h]` rows; kept channels in pivot order.
pub fn drrqr(cfg: &ModelConfig, k: usize, stats: &[LayerStats]) -> Result<(Selection, Vec<Vec<HeadInfo>>), PruneError> {
    let d = cfg.head_k_dim();
    let mut sel = Vec::new();
    let mut info = Vec::new();
    for (l, st) in stats.iter().enumerate() {
        let mut heads = Vec::new();
        let mut infos = Vec::new();
        for (h, res) in st.heads.iter().enumerate() {
            if res.len() < d {
                return Err(PruneError::Invalid {
                    field: "calibration",
                    expected: format!("at least {d} activation rows per head"),
                    actual: format!("{} rows for layer {l} head {h}", res.len()),
                });
            }
            let rows = res.rows();
            let m = Mat::from_fn(res.len(), d, |i, j| rows[i * d + j] as f64);
            let out = strong_rrqr(m.as_ref(), k, RRQR_F, RRQR_MAX_SWAPS);
            heads.push(out.perm[..k].to_vec());
            infos.push(HeadInfo { swaps: out.swaps, max_rho: out.max_rho, rows: res.len() });
        }
        sel.push(heads);
        info.push(infos);
    }
    Ok((sel, info))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_breaks_ties_to_the_lower_index_and_sorts() {
        assert_eq!(top_k_sorted(&[1.0, 3.0, 3.0, 0.5, 2.0], 3), vec![1, 2, 4]);
        assert_eq!(top_k_sorted(&[1.0, 1.0, 1.0], 2), vec![0, 1]);
    }

    #[test]
    fn rand_is_seeded_per_layer_and_head() {
        let a = rand(2, 3, 16, 5, 9);
        assert_eq!(a, rand(2, 3, 16, 5, 9));
        assert_ne!(a, rand(2, 3, 16, 5, 10));
        assert_ne!(a[0][0], a[0][1]);
        assert!(a.iter().flatten().all(|h| h.len() == 5 && h.windows(2).all(|w| w[0] < w[1])));
    }
}

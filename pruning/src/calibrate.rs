//! Calibration statistics, gathered once on the unpruned model (pruning-spec.md §1.3):
//! per-feature RMS of the mixer input (S-Wanda) and row samples of `[Q_h; K_h]` after the
//! short conv + SiLU, before the L2 norm (DRRQR); and summed LM-loss gradients of
//! `q_proj`/`k_proj` (Grad).

use candle_core::Tensor;
use deltaserve_engine::reference::{self, Observer, QkProj};
use deltaserve_engine::CausalLm;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// Rows kept per head for DRRQR (the reference's subsample size).
pub const DRRQR_ROWS: usize = 5000;

/// A uniform sample of at most `cap` rows (reservoir sampling, seeded).
#[derive(Debug, Clone)]
pub struct Reservoir {
    cap: usize,
    dim: usize,
    seen: usize,
    rows: Vec<f32>,
    rng: ChaCha20Rng,
}

impl Reservoir {
    fn new(cap: usize, dim: usize, seed: u64) -> Self {
        Self { cap, dim, seen: 0, rows: Vec::new(), rng: ChaCha20Rng::seed_from_u64(seed) }
    }

    fn push(&mut self, row: &[f32]) {
        self.seen += 1;
        if self.rows.len() < self.cap * self.dim {
            self.rows.extend_from_slice(row);
        } else {
            let j = self.rng.random_range(0..self.seen);
            if j < self.cap {
                self.rows[j * self.dim..(j + 1) * self.dim].copy_from_slice(row);
            }
        }
    }

    /// The sampled rows, row-major `[n, dim]`.
    pub fn rows(&self) -> &[f32] {
        &self.rows
    }

    /// Number of sampled rows.
    pub fn len(&self) -> usize {
        self.rows.len() / self.dim.max(1)
    }

    /// Whether nothing was sampled.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// What to gather.
#[derive(Debug, Clone, Copy)]
pub struct Wanted {
    /// Mixer-input RMS (S-Wanda).
    pub rms: bool,
    /// `[Q; K]` row samples (DRRQR).
    pub qk_rows: bool,
}

/// Statistics of one layer.
#[derive(Debug, Clone)]
pub struct LayerStats {
    /// Σ x_j² over tokens, f64.
    pub sumsq: Vec<f64>,
    /// Tokens seen.
    pub tokens: usize,
    /// One reservoir per q/k head of `[Q_h; K_h^(1..n)]` rows.
    pub heads: Vec<Reservoir>,
}

impl LayerStats {
    /// Per-feature RMS of the mixer input.
    pub fn rms(&self) -> Vec<f64> {
        self.sumsq.iter().map(|s| (s / self.tokens.max(1) as f64).sqrt()).collect()
    }
}

/// An [`Observer`] of the reference forward that accumulates [`LayerStats`] for every layer.
pub struct Collector {
    wanted: Wanted,
    heads: usize,
    head_dim: usize,
    layers: Vec<LayerStats>,
}

impl Collector {
    /// For `layers` layers of `heads` q/k heads of `head_dim` channels and hidden size `d`.
    pub fn new(wanted: Wanted, layers: usize, heads: usize, head_dim: usize, d: usize, seed: u64) -> Self {
        let stats = (0..layers)
            .map(|l| LayerStats {
                sumsq: vec![0.0; d],
                tokens: 0,
                heads: (0..heads).map(|h| Reservoir::new(DRRQR_ROWS, head_dim, seed ^ ((l as u64) << 32 | h as u64))).collect(),
            })
            .collect();
        Self { wanted, heads, head_dim, layers: stats }
    }

    /// The gathered statistics.
    pub fn into_stats(self) -> Vec<LayerStats> {
        self.layers
    }

    /// Runs `window` through `model`'s reference forward (from a zero state), gathering its
    /// statistics.
    pub fn observe(&mut self, model: &CausalLm, window: &[u32], qk: &[QkProj]) -> Result<(), crate::PruneError> {
        reference::logits(model, window, qk, Some(self))?;
        Ok(())
    }
}

fn rows_of(t: &Tensor) -> Option<Vec<Vec<f32>>> {
    t.to_dtype(candle_core::DType::F32).ok()?.to_vec2::<f32>().ok()
}

impl Observer for Collector {
    fn mixer_input(&mut self, layer: usize, x: &Tensor) {
        if !self.wanted.rms {
            return;
        }
        let Some(rows) = rows_of(x) else { return };
        let st = &mut self.layers[layer];
        for r in &rows {
            for (s, v) in st.sumsq.iter_mut().zip(r) {
                *s += (*v as f64) * (*v as f64);
            }
        }
        st.tokens += rows.len();
    }

    fn query_key(&mut self, layer: usize, q: &Tensor, k: &Tensor) {
        if !self.wanted.qk_rows {
            return;
        }
        let (Some(q), Some(k)) = (rows_of(q), rows_of(k)) else { return };
        let (h, d) = (self.heads, self.head_dim);
        let key_dim = h * d;
        let st = &mut self.layers[layer];
        for (qr, kr) in q.iter().zip(&k) {
            for (head, res) in st.heads.iter_mut().enumerate() {
                res.push(&qr[head * d..(head + 1) * d]);
                // k holds n householder blocks of H·K channels each.
                for block in kr.chunks(key_dim) {
                    res.push(&block[head * d..(head + 1) * d]);
                }
            }
        }
    }
}

/// The first-order Taylor scores' inputs: each layer's `q_proj`/`k_proj` weights and their
/// gradients summed over the calibration windows.
pub struct TaylorSums {
    /// `(W_q, ΣG_q, W_k, ΣG_k)` per layer, f32.
    pub layers: Vec<[Tensor; 4]>,
}

/// Grad's statistic: the LM-loss gradients of every layer's `q_proj`/`k_proj`, summed over
/// `windows` (fp32 accumulation; the reference accumulated in bf16), computed by candle's
/// autograd through the engine's reference forward. `tick` runs after each window.
pub fn taylor_sums(model: &CausalLm, windows: &[Vec<u32>], mut tick: impl FnMut()) -> Result<TaylorSums, crate::PruneError> {
    use candle_core::Var;
    let err = |e: candle_core::Error| crate::PruneError::Tensor { tensor: "q_proj/k_proj gradient".into(), message: e.to_string() };
    let weights = reference::qk_proj(model)?;
    let vars: Vec<(Var, Var)> =
        weights.iter().map(|w| Ok((Var::from_tensor(&w.q)?, Var::from_tensor(&w.k)?))).collect::<candle_core::Result<_>>().map_err(err)?;
    let qk: Vec<QkProj> = vars.iter().map(|(q, k)| QkProj { q: q.as_tensor().clone(), k: k.as_tensor().clone() }).collect();
    let mut sums: Vec<(Tensor, Tensor)> =
        weights.iter().map(|w| Ok((w.q.zeros_like()?, w.k.zeros_like()?))).collect::<candle_core::Result<_>>().map_err(err)?;
    for w in windows {
        let loss = reference::lm_loss(model, w, &qk)?;
        let grads = loss.backward().map_err(err)?;
        for ((q, k), (gq, gk)) in vars.iter().zip(sums.iter_mut()) {
            // A weight the loss does not reach has no gradient: it contributes zero.
            if let Some(g) = grads.get(q.as_tensor()) {
                *gq = (&*gq + g).map_err(err)?;
            }
            if let Some(g) = grads.get(k.as_tensor()) {
                *gk = (&*gk + g).map_err(err)?;
            }
        }
        tick();
    }
    // Selection runs on the CPU whatever device computed the gradients.
    let cpu = |t: Tensor| t.to_device(&candle_core::Device::Cpu);
    let layers = weights
        .into_iter()
        .zip(sums)
        .map(|(w, (gq, gk))| Ok([cpu(w.q)?, cpu(gq)?, cpu(w.k)?, cpu(gk)?]))
        .collect::<candle_core::Result<_>>()
        .map_err(err)?;
    Ok(TaylorSums { layers })
}

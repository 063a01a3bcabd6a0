//! Softmax attention layers of hybrid models (hybrid-spec.md §1.3 fla, §3.5 Qwen3.5's gated
//! attention, §5.4 OLMo-Hybrid): projections, optional q/k norms, RoPE, causal (optionally
//! windowed) GQA attention over the paged KV cache, Qwen's output gate, `o_proj`.

use candle_core::{DType, Device, Tensor};
use candle_nn::Linear;
use deltaserve_kernels::ops::{self, AttentionShape, Paged, QkNorms};

use super::batch::Keep;
use super::linear::{linear_to, project_delta};
use super::norm::{Delta, SubInput};
use super::rope::Rope;
use crate::cache::CacheSpec;
use crate::config::{AttentionSpec, QkNorm};
use crate::error::{EngineError, Result};
use crate::state::{KvLayer, KvPlan};
use crate::tensor_parallel::{grouped_heads, rows_at, Shard};
use crate::weights::Weights;

/// One attention layer (`self_attn` / fla's `attn`).
#[derive(Debug, Clone)]
pub struct Attention {
    /// `q | gate | k | v` rows in one GEMM (`gate` only with Qwen's output gate).
    qkv: Linear,
    o_proj: Linear,
    /// q/k norm weights, f32, with Qwen's `1 + w` already added.
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    eps: f32,
    rope: Option<Rope>,
    spec: AttentionSpec,
}

/// Rows `[h·2hd, h·2hd+hd)` of Qwen's `q_proj` are head h's query, the next hd its gate
/// (§3.5 step 1): returns (all queries, all gates), head-major.
fn split_interleaved(t: &Tensor, heads: usize, hd: usize) -> Result<(Tensor, Tensor)> {
    let rest: Vec<usize> = t.dims()[1..].to_vec();
    let mut shape = vec![heads, 2, hd];
    shape.extend(&rest);
    let t = t.reshape(shape)?;
    let flat = |x: Tensor| -> Result<Tensor> {
        let mut s = vec![heads * hd];
        s.extend(&rest);
        Ok(x.contiguous()?.reshape(s)?)
    };
    Ok((flat(t.narrow(1, 0, 1)?)?, flat(t.narrow(1, 1, 1)?)?))
}

/// q or k `[N, H·hd]` RMSNorm'd over all its heads at once (OLMo-Hybrid's q/k norm), in f32.
fn whole_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    Ok(candle_nn::ops::rms_norm(&x.to_dtype(DType::F32)?.contiguous()?, weight, eps)?)
}

impl Attention {
    /// Loads `q_proj`, `k_proj`, `v_proj`, `o_proj` (and biases, norms) as `spec` says.
    /// `zero_centred` norms store `w` for `x̂·(1 + w)` (Qwen).
    pub fn load(spec: &AttentionSpec, w: &Weights<'_>, hidden: usize, eps: f64, zero_centred: bool) -> Result<Self> {
        let (hq, hkv, hd) = (spec.num_heads, spec.num_kv_heads, spec.head_dim);
        let q_rows = if spec.output_gate { 2 * hq * hd } else { hq * hd };
        let mut weights = vec![w.get(&[q_rows, hidden], "q_proj.weight")?];
        let mut biases = if spec.qkv_bias { vec![w.get(&[q_rows], "q_proj.bias")?] } else { vec![] };
        if spec.output_gate {
            let (q, g) = split_interleaved(&weights[0], hq, hd)?;
            weights = vec![q, g];
            if let Some(b) = biases.pop() {
                let (q, g) = split_interleaved(&b, hq, hd)?;
                biases = vec![q, g];
            }
        }
        for name in ["k_proj", "v_proj"] {
            weights.push(w.get(&[hkv * hd, hidden], &format!("{name}.weight"))?);
            if spec.qkv_bias {
                biases.push(w.get(&[hkv * hd], &format!("{name}.bias"))?);
            }
        }
        let bias = if spec.qkv_bias { Some(Tensor::cat(&biases, 0)?) } else { None };
        let o_bias = if spec.o_bias { Some(w.get(&[hidden], "o_proj.bias")?) } else { None };
        let norm = |name: &str, len: usize| -> Result<Tensor> {
            let t = w.get_f32(&[len], &format!("{name}.weight"))?;
            Ok(if zero_centred { (t + 1.0)? } else { t })
        };
        let (q_norm, k_norm) = match spec.qk_norm {
            QkNorm::None => (None, None),
            QkNorm::PerHead => (Some(norm("q_norm", hd)?), Some(norm("k_norm", hd)?)),
            QkNorm::Whole => (Some(norm("q_norm", hq * hd)?), Some(norm("k_norm", hkv * hd)?)),
        };
        Ok(Self {
            qkv: Linear::new(Tensor::cat(&weights, 0)?, bias),
            o_proj: Linear::new(w.get(&[hidden, hq * hd], "o_proj.weight")?, o_bias),
            q_norm,
            k_norm,
            eps: eps as f32,
            rope: spec.rope.as_ref().map(|r| Rope::new(r, w.device())).transpose()?,
            spec: spec.clone(),
        })
    }

    /// The same layer on `dev`.
    pub fn to_device(&self, dev: &Device) -> Result<Self> {
        let to = |t: &Option<Tensor>| t.as_ref().map(|t| t.to_device(dev)).transpose();
        Ok(Self {
            qkv: linear_to(&self.qkv, dev)?,
            o_proj: linear_to(&self.o_proj, dev)?,
            q_norm: to(&self.q_norm)?,
            k_norm: to(&self.k_norm)?,
            rope: self.rope.as_ref().map(|r| r.to_device(dev)).transpose()?,
            ..self.clone()
        })
    }

    /// One tensor parallel rank's slice: its share of the query heads with the KV heads they
    /// read (a KV head read by two ranks is copied to both), and `o_proj` by its matching input
    /// columns, its bias on rank 0 only: the output is a partial sum. A q/k norm over all heads
    /// at once (OLMo-Hybrid's) would need the ranks' sums of squares, and is refused.
    pub fn shard(&self, s: Shard) -> Result<Self> {
        let (hq, hkv, hd) = (self.spec.num_heads, self.spec.num_kv_heads, self.spec.head_dim);
        if self.spec.qk_norm == QkNorm::Whole {
            return Err(EngineError::Invalid {
                field: "tensor parallel",
                expected: "attention with per-head or no q/k norms".into(),
                actual: "a q/k RMSNorm over all heads at once".into(),
            });
        }
        let (kv, q) = grouped_heads(s, hkv, hq, "num_attention_heads")?;
        // Row blocks of `qkv`: q, Qwen's gate, k, v.
        let gate = if self.spec.output_gate { hq * hd } else { 0 };
        let mut blocks = Vec::with_capacity(4);
        blocks.push(q.start * hd..q.end * hd);
        if gate > 0 {
            blocks.push(hq * hd + q.start * hd..hq * hd + q.end * hd);
        }
        let k0 = hq * hd + gate;
        blocks.push(k0 + kv.start * hd..k0 + kv.end * hd);
        blocks.push(k0 + hkv * hd + kv.start * hd..k0 + hkv * hd + kv.end * hd);
        let pick = |t: &Tensor| rows_at(t, &blocks);
        let qkv = Linear::new(pick(self.qkv.weight())?, self.qkv.bias().map(pick).transpose()?);
        let o_bias = if s.rank == 0 { self.o_proj.bias().cloned() } else { None };
        let o_proj = Linear::new(crate::tensor_parallel::columns(self.o_proj.weight(), &(q.start * hd..q.end * hd))?, o_bias);
        let spec = AttentionSpec { num_heads: q.len(), num_kv_heads: kv.len(), ..self.spec.clone() };
        Ok(Self { qkv, o_proj, spec, ..self.clone() })
    }

    /// One sequence's cache: keys and values of every token, in the paged KV cache. A 16-bit
    /// model on a GPU keeps them in its own type, as the references do (half the bytes, and the
    /// tensor cores read them as they are); otherwise in f32.
    pub fn cache(&self) -> CacheSpec {
        let w = self.qkv.weight();
        let dtype = match w.dtype() {
            DType::BF16 | DType::F16 if w.device().is_cuda() => w.dtype(),
            _ => DType::F32,
        };
        CacheSpec::Attention { kv_heads: self.spec.num_kv_heads, head_dim: self.spec.head_dim, dtype }
    }

    /// The attention kernels' view of this layer over `operands` (the model's compute dtype).
    pub fn shape(&self, operands: DType) -> AttentionShape {
        let s = &self.spec;
        let hd = s.head_dim;
        AttentionShape {
            q_heads: s.num_heads,
            kv_heads: s.num_kv_heads,
            head_dim: hd,
            window: s.window,
            scale: (hd as f32).powf(-0.5),
            operands,
        }
    }

    /// Rows of `x` `[N, D]` belong to sequences as `kv.cu` says; each appends its keys and
    /// values at its next positions and attends over its cache. Returns `[N, D]`, or the `keep`
    /// rows of it.
    pub fn forward(&self, x: &SubInput<'_>, cache: &mut KvLayer, kv: &KvPlan, keep: Keep<'_>) -> Result<Delta> {
        let s = &self.spec;
        let (n, hq, hkv, hd) = (x.rows()?, s.num_heads, s.num_kv_heads, s.head_dim);
        let y = x.project(&self.qkv)?;
        let gate_rows = if s.output_gate { hq * hd } else { 0 };
        let (q, k) = (y.narrow(1, 0, hq * hd)?, y.narrow(1, hq * hd + gate_rows, hkv * hd)?);
        let v = y.narrow(1, (hq + hkv) * hd + gate_rows, hkv * hd)?;
        // Per-head norms run inside the attention op, which reads q, k and v from `y` in place;
        // a norm over all heads at once (OLMo-Hybrid's) runs here first.
        let (q, k, norms) = match (&self.q_norm, &self.k_norm, s.qk_norm) {
            (Some(qw), Some(kw), QkNorm::PerHead) => (q, k, Some(QkNorms { q: qw, k: kw, eps: self.eps })),
            (Some(qw), Some(kw), QkNorm::Whole) => (whole_norm(&q, qw, self.eps)?, whole_norm(&k, kw, self.eps)?, None),
            _ => (q, k, None),
        };
        let shape = self.shape(x.dtype());
        let seqs = kv.seqs();
        let pass = Paged { seqs: &seqs, cu: &kv.cu, block_size: kv.block_size };
        let device = kv.device.as_ref().map(|d| d.pages(shape.tile_key()));
        let rope = self.rope.as_ref().map(Rope::args);
        // Qwen's output gate, o · sigmoid(gate), is applied as the op writes its output.
        let gate = if s.output_gate { Some(y.narrow(1, hq * hd, hq * hd)?) } else { None };
        let out = ops::AttnOutput { dtype: gate.as_ref().map_or(x.dtype(), |g| g.dtype()), gate: gate.as_ref() };
        let o = ops::paged_attention((&q, &k, &v), norms, &shape, rope, pass, device, (&mut cache.k, &mut cache.v), out)?;
        project_delta(&self.o_proj, &keep.rows(o.reshape((n, hq * hd))?)?)
    }
}

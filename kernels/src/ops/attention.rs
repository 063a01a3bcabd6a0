//! Softmax attention over a paged KV cache, for the attention layers of hybrid models: the new
//! rows' keys and values are written into their blocks, then every new query attends over its
//! sequence's cached keys (causal, optionally a sliding window, GQA). RoPE, when the layer has
//! it, is applied to q and k here, at the rows' positions.

use candle_core::{DType, Tensor};

use super::cpu_f32;
use crate::cpu::attention;
pub use crate::cpu::attention::{AttentionShape, Paged, PagedSeq};
use crate::{KernelError, Result, SlotBuffer};

/// Rotary embedding of a layer: `inv_freq` `[rot/2]` f32 (on the tensors' device) over the
/// first `rotary_dim` channels of each head.
#[derive(Debug, Clone, Copy)]
pub struct RopeArgs<'a> {
    /// `θ^(-2i/rot)`, i < rot/2.
    pub inv_freq: &'a Tensor,
    /// rot (even, ≤ hd).
    pub rotary_dim: usize,
}

/// Per-head RMSNorms on q and k before RoPE (Qwen3.5's and fla's `qk_norm`): weights `[hd]`
/// f32 on the tensors' device, applied as x / √(mean(x²) + eps) · w (a zero-centred norm's
/// `1 + w` already added).
#[derive(Debug, Clone, Copy)]
pub struct QkNorms<'a> {
    /// q's weight.
    pub q: &'a Tensor,
    /// k's weight.
    pub k: &'a Tensor,
    /// ε.
    pub eps: f32,
}

/// Where a GPU pass finds the cache: the pool's block table on the device and each row's slot
/// and position (device tensors, so that a CUDA graph can replay with new ones).
#[derive(Debug, Clone, Copy)]
pub struct DevicePages<'a> {
    /// `[slots · width]` i32: slot s's logical block j is physical block `tables[s · width + j]`.
    pub tables: &'a Tensor,
    /// Table entries per slot.
    pub width: usize,
    /// `[N]` i32: each row's slot.
    pub row_slot: &'a Tensor,
    /// `[N]` i32: each row's position.
    pub row_pos: &'a Tensor,
    /// A CUDA graph's fixed prefill tile list for this layer, `[capacity · 4]` i32 filled by
    /// [`attention_tiles`] before each replay; `None`: a pass builds and uploads its own.
    pub tiles: Option<&'a Tensor>,
}

/// Which prefill tile list an attention layer reads: layers of one key share one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TileKey {
    /// HQ.
    pub q_heads: usize,
    /// HKV.
    pub kv_heads: usize,
    /// hd.
    pub head_dim: usize,
    /// The sliding window, if any.
    pub window: Option<usize>,
}

impl AttentionShape {
    /// The key of this layer's prefill tile list.
    pub fn tile_key(&self) -> TileKey {
        TileKey { q_heads: self.q_heads, kv_heads: self.kv_heads, head_dim: self.head_dim, window: self.window }
    }
}

/// Rows of one prefill attention tile.
pub const ATTENTION_TILE_ROWS: usize = 64;

/// The tiles a fixed list needs at most for a pass of `rows` rows in `seqs` sequences (each
/// sequence's rows in tiles of [`ATTENTION_TILE_ROWS`]), rounded up to an even count.
pub fn attention_tile_capacity(rows: usize, seqs: usize) -> usize {
    (rows.div_ceil(ATTENTION_TILE_ROWS) + seqs).next_multiple_of(2)
}

/// The GPU prefill's tile list for `pass` at `shape`, laid out for a fixed buffer of
/// `capacity` tiles ([`attention_tile_capacity`], `[capacity · 4]` i32): what a CUDA graph
/// writes into [`DevicePages::tiles`] before it replays.
#[cfg(feature = "cuda")]
pub fn attention_tiles(shape: &AttentionShape, pass: &Paged<'_>, capacity: usize, dev: &candle_core::Device) -> Result<Vec<i32>> {
    crate::cuda::attention::fixed_tiles(shape, pass, capacity, dev)
}

/// What [`paged_attention`] returns: values in `dtype` (f32, bf16 or f16), each first
/// multiplied by sigmoid(gate) where `gate` is given (Qwen's gated attention: `gate` `[N, HQ·hd]`
/// in `dtype`, a column slice of the layer's projection), computed in fp32 and rounded once.
#[derive(Debug, Clone, Copy)]
pub struct AttnOutput<'a> {
    /// The output's dtype.
    pub dtype: DType,
    /// Qwen's output gate.
    pub gate: Option<&'a Tensor>,
}

impl AttnOutput<'_> {
    /// The fp32 attention output `o` `[N, HQ, hd]` gated and rounded as asked: the generic path
    /// (the CPU, and the GPU's tensor-core prefill); the GPU's decode kernel does the same in its
    /// last step.
    pub(crate) fn finish(&self, o: Tensor) -> Result<Tensor> {
        let (n, hq, hd) = o.dims3()?;
        match self.gate {
            Some(g) => Ok(super::sigmoid_gate(&o.reshape((n, hq * hd))?, g)?.reshape((n, hq, hd))?),
            None => Ok(o.to_dtype(self.dtype)?),
        }
    }
}

/// Appends `k`, `v` (`[N, HKV, hd]`, or `[N, HKV·hd]` such as column slices of the layer's
/// projection, read in place on the GPU; any float dtype) at each sequence's next positions and
/// attends with `q` (`[N, HQ, hd]` or `[N, HQ·hd]`), q and k first normalised per head when
/// `norms` is given; rows `pass.cu[s]..pass.cu[s+1]` belong to `pass.seqs[s]`. The caches hold
/// one block per slot, `[block_size, HKV, hd]`: f32, or on a GPU also bf16/f16 (prefill of
/// 16-bit operands then runs on the tensor cores). GPU caches also need `device` (the same
/// tables and positions in device memory). Returns `[N, HQ, hd]` as `out` says.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    norms: Option<QkNorms<'_>>,
    shape: &AttentionShape,
    rope: Option<RopeArgs<'_>>,
    pass: Paged<'_>,
    device: Option<DevicePages<'_>>,
    (k_cache, v_cache): (&mut SlotBuffer, &mut SlotBuffer),
    out: AttnOutput<'_>,
) -> Result<Tensor> {
    const OP: &str = "paged_attention";
    let (seqs, cu, block_size) = (pass.seqs, pass.cu, pass.block_size);
    let (hq, hkv, hd) = (shape.q_heads, shape.kv_heads, shape.head_dim);
    let n = q.dim(0)?;
    for (input, t, heads) in [("q", q, hq), ("k", k, hkv), ("v", v, hkv)] {
        if t.dims() != [n, heads, hd] && t.dims() != [n, heads * hd] {
            return Err(KernelError::Shape {
                op: OP,
                input,
                expected: format!("[{n}, {heads}, {hd}] or [{n}, {}]", heads * hd),
                actual: t.dims().to_vec(),
            });
        }
    }
    if !matches!(out.dtype, DType::F32 | DType::BF16 | DType::F16) {
        return Err(KernelError::Unsupported { op: OP, what: format!("output dtype {:?}, expected f32, bf16 or f16", out.dtype) });
    }
    if let Some(g) = out.gate {
        if g.dims() != [n, hq * hd] {
            return Err(KernelError::Shape { op: OP, input: "gate", expected: format!("[{n}, {}]", hq * hd), actual: g.dims().to_vec() });
        }
        if g.dtype() != out.dtype {
            return Err(KernelError::Unsupported {
                op: OP,
                what: format!("gate dtype {:?}, expected the output's, {:?}", g.dtype(), out.dtype),
            });
        }
    }
    if let Some(nw) = norms {
        for (input, t) in [("q norm", nw.q), ("k norm", nw.k)] {
            if t.dims() != [hd] {
                return Err(KernelError::Shape { op: OP, input, expected: format!("[{hd}]"), actual: t.dims().to_vec() });
            }
        }
    }
    if let Some(r) = rope {
        if r.rotary_dim % 2 != 0 || r.rotary_dim > hd || r.inv_freq.dims() != [r.rotary_dim / 2] {
            return Err(KernelError::Shape {
                op: OP,
                input: "inv_freq",
                expected: format!("[rot/2] for an even rot ≤ {hd} (rot = {})", r.rotary_dim),
                actual: r.inv_freq.dims().to_vec(),
            });
        }
    }
    if hkv == 0 || hq % hkv != 0 || shape.window == Some(0) {
        return Err(KernelError::Shape {
            op: OP,
            input: "shape",
            expected: "HQ a multiple of HKV > 0, window ≥ 1".into(),
            actual: vec![hq, hkv],
        });
    }
    let ok = cu.len() == seqs.len() + 1 && cu.first() == Some(&0) && cu.last() == Some(&n) && cu.windows(2).all(|w| w[0] <= w[1]);
    if !ok {
        return Err(KernelError::Shape {
            op: OP,
            input: "cu_seqlens",
            expected: format!("0 ≤ … ≤ {n}, {} entries", seqs.len() + 1),
            actual: cu.to_vec(),
        });
    }
    for c in [&*k_cache, &*v_cache] {
        if c.per_slot() != block_size * hkv * hd {
            return Err(KernelError::Shape {
                op: OP,
                input: "cache",
                expected: format!("[{block_size}, {hkv}, {hd}] per block"),
                actual: vec![c.per_slot()],
            });
        }
    }
    for (s, seq) in seqs.iter().enumerate() {
        let end = seq.start + cu[s + 1] - cu[s];
        let blocks = end.div_ceil(block_size.max(1));
        if seq.table.len() < blocks || seq.table.iter().any(|&b| b as usize >= k_cache.slots()) {
            return Err(KernelError::Shape {
                op: OP,
                input: "block table",
                expected: format!("≥ {blocks} blocks below {} for {end} tokens", k_cache.slots()),
                actual: seq.table.iter().map(|&b| b as usize).collect(),
            });
        }
    }
    #[cfg(feature = "cuda")]
    if let (Some(kc), Some(vc)) = (k_cache.device_slots(), v_cache.device_slots()) {
        let Some(pages) = device else {
            return Err(KernelError::UnsupportedDevice { op: OP, device: "cuda without device block tables".into() });
        };
        for (input, t) in [("row_slot", pages.row_slot), ("row_pos", pages.row_pos)] {
            if t.dims() != [n] || !crate::slots::index_dtype(t.dtype()) {
                return Err(KernelError::Shape { op: OP, input, expected: format!("[{n}] i32 or u32"), actual: t.dims().to_vec() });
            }
        }
        if pages.tables.dtype() != DType::I32 || pages.width == 0 || pages.tables.elem_count() % pages.width != 0 {
            return Err(KernelError::Shape {
                op: OP,
                input: "tables",
                expected: format!("[slots · {}] i32", pages.width),
                actual: pages.tables.dims().to_vec(),
            });
        }
        if let Some(seq) = pass.seqs.iter().find(|s| s.table.len() > pages.width) {
            return Err(KernelError::Shape {
                op: OP,
                input: "block table",
                expected: format!("at most {} blocks a sequence", pages.width),
                actual: vec![seq.table.len()],
            });
        }
        return crate::cuda::paged_attention((q, k, v), norms, shape, rope, &pass, &pages, (kc, vc), out);
    }
    let _ = device;
    if !k_cache.is_host() || !v_cache.is_host() {
        return Err(KernelError::UnsupportedDevice { op: OP, device: "caches on different devices".into() });
    }
    // Per-head norms: candle's RMSNorm over the heads as rows.
    let normed = |t: &Tensor, w: Option<&Tensor>, eps: f32| -> Result<Vec<f32>> {
        match w {
            Some(w) => {
                let rows = t.to_dtype(DType::F32)?.contiguous()?.reshape(((), hd))?;
                cpu_f32(OP, &candle_nn::ops::rms_norm(&rows, w, eps)?)
            }
            None => cpu_f32(OP, t),
        }
    };
    let eps = norms.map_or(0.0, |n| n.eps);
    let (mut qs, mut ks, vs) = (normed(q, norms.map(|n| n.q), eps)?, normed(k, norms.map(|n| n.k), eps)?, cpu_f32(OP, v)?);
    if let Some(r) = rope {
        let (pos, inv_freq) = (attention::positions(pass), cpu_f32(OP, r.inv_freq)?);
        attention::rope(&mut qs, hq, hd, &pos, &inv_freq);
        attention::rope(&mut ks, hkv, hd, &pos, &inv_freq);
    }
    attention::append(&ks, &vs, shape, pass, k_cache.host_mut(OP)?, v_cache.host_mut(OP)?);
    let o = attention::attend(&qs, shape, pass, k_cache.host(OP)?, v_cache.host(OP)?);
    out.finish(Tensor::from_vec(o, (n, hq, hd), q.device())?)
}

/// Turns the GPU's fused decode kernel (a decode step's append inside the row kernel) on or off
/// for the process: the GPU test compares the two paths. Nothing changes on the CPU.
#[doc(hidden)]
pub fn set_fused_decode_attention(on: bool) {
    #[cfg(feature = "cuda")]
    crate::cuda::set_fused_decode(on);
    let _ = on;
}

/// Turns the GPU's two-head prefill attention blocks (d = 256, GQA) on or off for the process:
/// the GPU test compares them with one head a block. Nothing changes on the CPU.
#[doc(hidden)]
pub fn set_attention_head_pairs(on: bool) {
    #[cfg(feature = "cuda")]
    crate::cuda::set_attn_head_pairs(on);
    let _ = on;
}

/// Turns the GPU's warpgroup prefill attention (`attn_wg_*`, sm_90a) on or off for the process:
/// the GPU test compares it with the mma.sync tile kernel. Nothing changes on the CPU.
#[doc(hidden)]
pub fn set_attention_warpgroup(on: bool) {
    #[cfg(feature = "cuda")]
    crate::cuda::set_attn_warpgroup(on);
    let _ = on;
}

/// How many warpgroup prefill attention launches this process has made (0 without CUDA): the
/// GPU test checks that the kernel it compares ran.
#[doc(hidden)]
pub fn attention_warpgroup_launches() -> usize {
    #[cfg(feature = "cuda")]
    let launches = crate::cuda::attn_warpgroup_launches();
    #[cfg(not(feature = "cuda"))]
    let launches = 0;
    launches
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the CPU the op gates and rounds as `AttnOutput` asks: with Qwen's gate each value is the
    /// ungated f32 output times sigmoid(gate) (computed here in f64), rounded once to bf16; a
    /// gate of the wrong shape or dtype is refused, naming it.
    #[test]
    fn output_is_gated_and_rounded_as_asked() {
        let dev = &candle_core::Device::Cpu;
        let shape = AttentionShape { q_heads: 2, kv_heads: 1, head_dim: 4, window: None, scale: 0.5, operands: DType::F32 };
        let (n, bs) = (3usize, 4usize);
        let vals = |len: usize, seed: u32, scale: f32| -> Vec<f32> {
            (0..len).map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / 16777216.0 - 0.5) * scale).collect()
        };
        let t = |len, seed, dims: &[usize], scale| Tensor::from_vec(vals(len, seed, scale), dims, dev).unwrap();
        let (q, k, v) = (t(n * 8, 1, &[n, 2, 4], 2.0), t(n * 4, 2, &[n, 1, 4], 2.0), t(n * 4, 3, &[n, 1, 4], 2.0));
        let gate = t(n * 8, 4, &[n, 8], 8.0).to_dtype(DType::BF16).unwrap();
        let table = [0u32];
        let run = |out: AttnOutput<'_>| {
            let (mut kc, mut vc) = (SlotBuffer::zeros(1, bs * 4), SlotBuffer::zeros(1, bs * 4));
            let seqs = [PagedSeq { start: 0, slot: 0, table: &table }];
            let pass = Paged { seqs: &seqs, cu: &[0, n], block_size: bs };
            paged_attention((&q, &k, &v), None, &shape, None, pass, None, (&mut kc, &mut vc), out)
        };
        let plain = run(AttnOutput { dtype: DType::F32, gate: None }).unwrap();
        let gated = run(AttnOutput { dtype: DType::BF16, gate: Some(&gate) }).unwrap();
        assert_eq!((gated.dims(), gated.dtype()), (&[n, 2, 4][..], DType::BF16));
        let f32s = |t: &Tensor| t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let (o, g, y) = (f32s(&plain), f32s(&gate), f32s(&gated));
        for i in 0..o.len() {
            let want = o[i] as f64 / (1.0 + (-g[i] as f64).exp());
            assert!((y[i] as f64 - want).abs() <= want.abs() / 256.0 + 1e-6, "element {i}: {} against {want}", y[i]);
        }
        let narrow = gate.narrow(1, 0, 4).unwrap();
        let err = run(AttnOutput { dtype: DType::BF16, gate: Some(&narrow) }).unwrap_err().to_string();
        assert!(err.contains("`gate` has shape [3, 4], expected [3, 8]"), "{err}");
        let wide = gate.to_dtype(DType::F32).unwrap();
        let err = run(AttnOutput { dtype: DType::BF16, gate: Some(&wide) }).unwrap_err().to_string();
        assert!(err.contains("gate dtype F32, expected the output's, BF16"), "{err}");
    }
}

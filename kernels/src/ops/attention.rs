//! Softmax attention over a paged KV cache, for the attention layers of hybrid models: the new
//! rows' keys and values are written into their blocks, then every new query attends over its
//! sequence's cached keys (causal, optionally a sliding window, GQA).

use candle_core::Tensor;

use super::cpu_f32;
use crate::cpu::attention;
pub use crate::cpu::attention::{AttentionShape, Paged, PagedSeq};
use crate::{KernelError, Result, SlotBuffer};

/// Appends `k`, `v` (`[N, HKV, hd]`) at each sequence's next positions and attends with `q`
/// (`[N, HQ, hd]`); rows `pass.cu[s]..pass.cu[s+1]` belong to `pass.seqs[s]`. The caches hold
/// one block per slot, `[block_size, HKV, hd]` f32. Returns `[N, HQ, hd]` f32.
pub fn paged_attention(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    shape: &AttentionShape,
    pass: Paged<'_>,
    k_cache: &mut SlotBuffer,
    v_cache: &mut SlotBuffer,
) -> Result<Tensor> {
    const OP: &str = "paged_attention";
    let (seqs, cu, block_size) = (pass.seqs, pass.cu, pass.block_size);
    let (hq, hkv, hd) = (shape.q_heads, shape.kv_heads, shape.head_dim);
    let n = q.dim(0)?;
    for (input, t, heads) in [("q", q, hq), ("k", k, hkv), ("v", v, hkv)] {
        if t.dims() != [n, heads, hd] {
            return Err(KernelError::Shape { op: OP, input, expected: format!("[{n}, {heads}, {hd}]"), actual: t.dims().to_vec() });
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
    if !k_cache.is_host() {
        return Err(KernelError::UnsupportedDevice { op: OP, device: "cuda (attention layers run on the CPU only)".into() });
    }
    let (qs, ks, vs) = (cpu_f32(OP, q)?, cpu_f32(OP, k)?, cpu_f32(OP, v)?);
    attention::append(&ks, &vs, shape, pass, k_cache.host_mut(OP)?, v_cache.host_mut(OP)?);
    let out = attention::attend(&qs, shape, pass, k_cache.host(OP)?, v_cache.host(OP)?);
    Ok(Tensor::from_vec(out, (n, hq, hd), q.device())?)
}

//! Causal softmax attention over a paged KV cache (hybrid-spec.md §1.3–1.4, §3.5, §5.4): keys
//! and values live in fixed-size blocks, `[block_size, HKV, hd]` each, found through a
//! per-sequence block table.

use candle_core::DType;
use rayon::prelude::*;

/// Head counts, sizes and masking of one attention layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    /// HQ.
    pub q_heads: usize,
    /// HKV (HQ is a multiple: query head h reads KV head h / (HQ/HKV)).
    pub kv_heads: usize,
    /// hd.
    pub head_dim: usize,
    /// Sliding window w: a query at position i sees keys i-w+1..=i. `None`: all earlier keys.
    pub window: Option<usize>,
    /// Score scale, usually hd^-0.5.
    pub scale: f32,
    /// The model's compute dtype. A GPU prefill with bf16 or f16 rounds q, k, v and the
    /// probabilities to it on the tensor cores (as flash-attention does); f32 stays fp32.
    pub operands: DType,
}

/// Where one sequence's rows sit in the cache.
#[derive(Debug, Clone, Copy)]
pub struct PagedSeq<'a> {
    /// Tokens already in the cache before this pass (the first new row's position).
    pub start: usize,
    /// The sequence's slot (its row of a device block table).
    pub slot: usize,
    /// Logical block → physical block.
    pub table: &'a [u32],
}

/// One pass over the cache: its sequences, their rows (`cu`) and the block size.
#[derive(Debug, Clone, Copy)]
pub struct Paged<'a> {
    /// Each sequence's start and block table.
    pub seqs: &'a [PagedSeq<'a>],
    /// Row offsets, `seqs.len() + 1` entries.
    pub cu: &'a [usize],
    /// Tokens per block.
    pub block_size: usize,
}

/// Offset of position `pos`'s `[HKV, hd]` row in a cache buffer.
fn row_offset(table: &[u32], pos: usize, block_size: usize, row: usize) -> usize {
    (table[pos / block_size] as usize * block_size + pos % block_size) * row
}

/// Each row's absolute position: `start + (row - cu[s])` for the rows of sequence `s`.
pub fn positions(pass: Paged<'_>) -> Vec<usize> {
    pass.seqs.iter().enumerate().flat_map(|(s, seq)| (0..pass.cu[s + 1] - pass.cu[s]).map(move |t| seq.start + t)).collect()
}

/// Rotates `x` `[N, H, hd]` in place, row `n` by the angle `positions[n] · inv_freq[i]` (fp32)
/// on the pairs `(i, i + rot/2)`, `i < rot/2` (half-split RoPE); channels past rot stay.
pub fn rope(x: &mut [f32], heads: usize, hd: usize, positions: &[usize], inv_freq: &[f32]) {
    let half = inv_freq.len();
    x.par_chunks_mut(heads * hd).zip(positions).for_each(|(row, &p)| {
        let (cos, sin): (Vec<f32>, Vec<f32>) = inv_freq.iter().map(|f| (p as f32 * f).sin_cos()).map(|(s, c)| (c, s)).unzip();
        for head in row.chunks_mut(hd) {
            for i in 0..half {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * cos[i] - b * sin[i];
                head[i + half] = b * cos[i] + a * sin[i];
            }
        }
    });
}

/// Writes the new rows' keys and values (`[N, HKV, hd]` each, packed by `cu`) into the cache.
pub fn append(k: &[f32], v: &[f32], shape: &AttentionShape, pass: Paged<'_>, k_cache: &mut [f32], v_cache: &mut [f32]) {
    let (seqs, cu, block_size) = (pass.seqs, pass.cu, pass.block_size);
    let row = shape.kv_heads * shape.head_dim;
    for (s, seq) in seqs.iter().enumerate() {
        for n in cu[s]..cu[s + 1] {
            let at = row_offset(seq.table, seq.start + n - cu[s], block_size, row);
            k_cache[at..at + row].copy_from_slice(&k[n * row..(n + 1) * row]);
            v_cache[at..at + row].copy_from_slice(&v[n * row..(n + 1) * row]);
        }
    }
}

/// Attention of the new rows' queries `q` `[N, HQ, hd]` over each sequence's cached keys (the
/// new ones appended first). Returns `[N, HQ, hd]`.
pub fn attend(q: &[f32], shape: &AttentionShape, pass: Paged<'_>, k_cache: &[f32], v_cache: &[f32]) -> Vec<f32> {
    let (seqs, cu, block_size) = (pass.seqs, pass.cu, pass.block_size);
    let (hq, hkv, hd) = (shape.q_heads, shape.kv_heads, shape.head_dim);
    let (group, row) = (hq / hkv, hkv * hd);
    let n_rows = cu[cu.len() - 1];
    let mut out = vec![0f32; n_rows * hq * hd];
    out.par_chunks_mut(hq * hd).enumerate().for_each(|(n, o)| {
        let s = cu.partition_point(|&c| c <= n) - 1;
        let seq = &seqs[s];
        let pos = seq.start + n - cu[s];
        let lo = shape.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let mut scores = vec![0f32; pos + 1 - lo];
        for h in 0..hq {
            let qh = &q[(n * hq + h) * hd..(n * hq + h + 1) * hd];
            let kvh = h / group;
            let mut max = f32::NEG_INFINITY;
            for (j, sc) in (lo..=pos).zip(scores.iter_mut()) {
                let at = row_offset(seq.table, j, block_size, row) + kvh * hd;
                let dot: f32 = qh.iter().zip(&k_cache[at..at + hd]).map(|(a, b)| a * b).sum();
                *sc = dot * shape.scale;
                max = max.max(*sc);
            }
            let mut sum = 0f32;
            for sc in scores.iter_mut() {
                *sc = (*sc - max).exp();
                sum += *sc;
            }
            let oh = &mut o[h * hd..(h + 1) * hd];
            for (j, p) in (lo..=pos).zip(&scores) {
                let at = row_offset(seq.table, j, block_size, row) + kvh * hd;
                let p = p / sum;
                oh.iter_mut().zip(&v_cache[at..at + hd]).for_each(|(o, v)| *o += p * v);
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain dense causal attention over contiguous keys, the textbook formula in f64.
    fn dense(q: &[f32], k: &[f32], v: &[f32], t: usize, shape: &AttentionShape) -> Vec<f32> {
        let (hq, hkv, hd) = (shape.q_heads, shape.kv_heads, shape.head_dim);
        let mut out = vec![0f32; t * hq * hd];
        for i in 0..t {
            for h in 0..hq {
                let kh = h / (hq / hkv);
                let lo = shape.window.map_or(0, |w| (i + 1).saturating_sub(w));
                let s: Vec<f64> = (lo..=i)
                    .map(|j| {
                        (0..hd).map(|d| q[(i * hq + h) * hd + d] as f64 * k[(j * hkv + kh) * hd + d] as f64).sum::<f64>()
                            * shape.scale as f64
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hd {
                    let o: f64 = (lo..=i).zip(&e).map(|(j, p)| p / z * v[(j * hkv + kh) * hd + d] as f64).sum();
                    out[(i * hq + h) * hd + d] = o as f32;
                }
            }
        }
        out
    }

    fn pseudo(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / 16777216.0) - 0.5).collect()
    }

    #[test]
    fn paged_chunks_equal_dense_attention() {
        for window in [None, Some(5)] {
            let shape = AttentionShape { q_heads: 4, kv_heads: 2, head_dim: 8, window, scale: 8f32.powf(-0.5), operands: DType::F32 };
            let (t, bs, row) = (23, 4, 2 * 8);
            let (q, k, v) = (pseudo(t * 4 * 8, 1), pseudo(t * row, 2), pseudo(t * row, 3));
            let want = dense(&q, &k, &v, t, &shape);
            // Scattered physical blocks, and the sequence fed as chunks of 7, 1, 15 rows.
            let table: Vec<u32> = vec![5, 0, 3, 7, 1, 6];
            let (mut kc, mut vc) = (vec![0f32; 8 * bs * row], vec![0f32; 8 * bs * row]);
            let mut got = vec![];
            for (a, b) in [(0, 7), (7, 8), (8, 23)] {
                let seq = [PagedSeq { start: a, slot: 0, table: &table }];
                let pass = Paged { seqs: &seq, cu: &[0, b - a], block_size: bs };
                append(&k[a * row..b * row], &v[a * row..b * row], &shape, pass, &mut kc, &mut vc);
                got.extend(attend(&q[a * 32..b * 32], &shape, pass, &kc, &vc));
            }
            let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(err < 1e-6, "window {window:?}: max error {err}");
        }
    }
}

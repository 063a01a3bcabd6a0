//! Gated delta rule on the CPU (model-spec.md §1.3 step 8, §3.4, §3.5).
//!
//! Layouts, all row-major f32, for one sequence:
//! - `q`, `k`: `[T, H, K]`, already L2-normalised;
//! - `v`: `[T, HV, V]`; `beta`, `g`: `[T, HV]` (g is the log-decay, ≤ 0);
//! - state: `[HV, K, V]` (K-major: a row of V values per key channel, so the
//!   rank-1 write and the read-out both stream contiguous rows);
//! - output `o`: `[T, HV, V]`.
//!
//! Value head `j` reads q/k head `j / (HV / H)` (GVA, §1.4).

use rayon::prelude::*;

pub use crate::PREFILL_CHUNK as CHUNK;

/// Problem sizes of one gated-delta-rule call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// Tokens (rows) in the sequence.
    pub t: usize,
    /// q/k heads.
    pub h: usize,
    /// Value heads (a multiple of `h`).
    pub hv: usize,
    /// Key head dim.
    pub k: usize,
    /// Value head dim.
    pub v: usize,
}

impl Dims {
    fn group(&self) -> usize {
        self.hv / self.h
    }
}

/// Borrowed inputs of one sequence.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// `[T, H, K]`, L2-normalised.
    pub q: &'a [f32],
    /// `[T, H, K]`, L2-normalised.
    pub k: &'a [f32],
    /// `[T, HV, V]`.
    pub v: &'a [f32],
    /// `[T, HV]`.
    pub beta: &'a [f32],
    /// `[T, HV]` log-decay; `None` means no decay (g = 0).
    pub g: Option<&'a [f32]>,
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[inline]
fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// One token's write for one value head: key, value, β and log-decay.
#[derive(Debug, Clone, Copy)]
pub struct HeadStep<'a> {
    /// `[K]`, L2-normalised.
    pub k: &'a [f32],
    /// `[V]`.
    pub v: &'a [f32],
    /// Write strength β.
    pub beta: f32,
    /// Log-decay g (0 for none).
    pub g: f32,
}

/// A read-out after the write: `o = Sᵀ(scale·q)`.
#[derive(Debug)]
pub struct ReadOut<'a> {
    /// `[K]`, L2-normalised.
    pub q: &'a [f32],
    /// Read-out scale.
    pub scale: f32,
    /// `[V]` destination.
    pub o: &'a mut [f32],
}

/// One recurrent step for one value head, in the order of §1.3 step 8:
/// decay, delta write, then (optionally) the read-out after the update.
#[inline]
pub fn recurrent_head_step(state: &mut [f32], x: HeadStep<'_>, read: Option<ReadOut<'_>>) {
    let (k, v) = (x.k, x.v);
    let vd = v.len();
    if x.g != 0.0 {
        let alpha = x.g.exp();
        state.iter_mut().for_each(|s| *s *= alpha);
    }
    // u = β (v − Sᵀk)
    let mut u = v.to_vec();
    for (i, &ki) in k.iter().enumerate() {
        if ki != 0.0 {
            axpy(-ki, &state[i * vd..(i + 1) * vd], &mut u);
        }
    }
    u.iter_mut().for_each(|e| *e *= x.beta);
    for (i, &ki) in k.iter().enumerate() {
        if ki != 0.0 {
            axpy(ki, &u, &mut state[i * vd..(i + 1) * vd]);
        }
    }
    if let Some(r) = read {
        r.o.iter_mut().for_each(|e| *e = 0.0);
        for (i, &qi) in r.q.iter().enumerate() {
            if qi != 0.0 {
                axpy(qi * r.scale, &state[i * vd..(i + 1) * vd], r.o);
            }
        }
    }
}

/// Token-by-token recurrence over a whole sequence (the reference path).
/// `state` is `[HV, K, V]`, read as the initial state and left as the final one.
pub fn recurrent_gated_delta_rule(d: Dims, x: Inputs<'_>, scale: f32, state: &mut [f32], o: &mut [f32]) {
    let (kd, vd, g) = (d.k, d.v, d.group());
    let mut out_heads: Vec<Vec<f32>> = state
        .par_chunks_mut(kd * vd)
        .enumerate()
        .map(|(j, s)| {
            let hk = j / g;
            let mut oh = vec![0f32; d.t * vd];
            for t in 0..d.t {
                let qk = (t * d.h + hk) * kd;
                let vv = (t * d.hv + j) * vd;
                let gt = x.g.map_or(0.0, |g| g[t * d.hv + j]);
                recurrent_head_step(
                    s,
                    HeadStep { k: &x.k[qk..qk + kd], v: &x.v[vv..vv + vd], beta: x.beta[t * d.hv + j], g: gt },
                    Some(ReadOut { q: &x.q[qk..qk + kd], scale, o: &mut oh[t * vd..(t + 1) * vd] }),
                );
            }
            oh
        })
        .collect();
    scatter_heads(d, &mut out_heads, o);
}

/// Writes per-head outputs `[HV][T, V]` into `o` `[T, HV, V]`.
fn scatter_heads(d: Dims, heads: &mut [Vec<f32>], o: &mut [f32]) {
    for (j, oh) in heads.iter().enumerate() {
        for t in 0..d.t {
            o[(t * d.hv + j) * d.v..(t * d.hv + j + 1) * d.v].copy_from_slice(&oh[t * d.v..(t + 1) * d.v]);
        }
    }
}

/// Chunkwise-parallel gated delta rule (chunk 64, WY/UT form, §3.5).
/// `state` is `[HV, K, V]`, read as the initial state and left as the final one.
pub fn chunk_gated_delta_rule(d: Dims, x: Inputs<'_>, scale: f32, state: &mut [f32], o: &mut [f32]) {
    let (kd, vd, grp) = (d.k, d.v, d.group());
    let mut out_heads: Vec<Vec<f32>> = state
        .par_chunks_mut(kd * vd)
        .enumerate()
        .map(|(j, s)| {
            let mut oh = vec![0f32; d.t * vd];
            let mut ws = ChunkWorkspace::new(kd, vd);
            let mut t0 = 0;
            while t0 < d.t {
                let len = CHUNK.min(d.t - t0);
                ws.load(d, x, j, j / grp, t0, len, scale);
                ws.run(s, &mut oh[t0 * vd..(t0 + len) * vd]);
                t0 += len;
            }
            oh
        })
        .collect();
    scatter_heads(d, &mut out_heads, o);
}

/// Buffers for one chunk of one head, reused across chunks.
struct ChunkWorkspace {
    kd: usize,
    vd: usize,
    len: usize,
    q: Vec<f32>,     // [C, K], pre-scaled
    k: Vec<f32>,     // [C, K]
    v: Vec<f32>,     // [C, V]
    beta: Vec<f32>,  // [C]
    gamma: Vec<f32>, // [C] chunk-local cumulative log-decay
    a: Vec<f32>,     // [C, C] strictly lower A, then T = (I + A)^-1
    w: Vec<f32>,     // [C, K]
    u: Vec<f32>,     // [C, V], becomes Vnew
    tmp: Vec<f32>,   // [C] row scratch
}

impl ChunkWorkspace {
    fn new(kd: usize, vd: usize) -> Self {
        Self {
            kd,
            vd,
            len: 0,
            q: vec![0.0; CHUNK * kd],
            k: vec![0.0; CHUNK * kd],
            v: vec![0.0; CHUNK * vd],
            beta: vec![0.0; CHUNK],
            gamma: vec![0.0; CHUNK],
            a: vec![0.0; CHUNK * CHUNK],
            w: vec![0.0; CHUNK * kd],
            u: vec![0.0; CHUNK * vd],
            tmp: vec![0.0; CHUNK],
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn load(&mut self, d: Dims, x: Inputs<'_>, j: usize, hk: usize, t0: usize, len: usize, scale: f32) {
        let (kd, vd) = (self.kd, self.vd);
        self.len = len;
        let mut acc = 0f32;
        for r in 0..len {
            let t = t0 + r;
            let qk = (t * d.h + hk) * kd;
            for (dst, src) in self.q[r * kd..(r + 1) * kd].iter_mut().zip(&x.q[qk..qk + kd]) {
                *dst = src * scale;
            }
            self.k[r * kd..(r + 1) * kd].copy_from_slice(&x.k[qk..qk + kd]);
            let vv = (t * d.hv + j) * vd;
            self.v[r * vd..(r + 1) * vd].copy_from_slice(&x.v[vv..vv + vd]);
            self.beta[r] = x.beta[t * d.hv + j];
            acc += x.g.map_or(0.0, |g| g[t * d.hv + j]);
            self.gamma[r] = acc;
        }
    }

    /// Advances `state` over this chunk and writes the chunk's outputs `[len, V]`.
    fn run(&mut self, state: &mut [f32], o: &mut [f32]) {
        let (kd, vd, n) = (self.kd, self.vd, self.len);
        let (q, k, gm) = (&self.q, &self.k, &self.gamma);
        // 1) A[r,s] = β_r (k_r·k_s) e^{γ_r−γ_s}, s < r. The exponent is ≤ 0 there,
        //    so masking by construction avoids the inf·0 of §3.6.4.
        let a = &mut self.a;
        for r in 0..n {
            for s in 0..r {
                a[r * CHUNK + s] = self.beta[r] * dot(&k[r * kd..(r + 1) * kd], &k[s * kd..(s + 1) * kd]) * (gm[r] - gm[s]).exp();
            }
        }
        // 2) T = (I + A)^-1 by forward substitution, row r: T_r = e_r − Σ_{s<r} A[r,s] T_s.
        //    T is unit lower triangular; the strict part overwrites A in place.
        for r in 0..n {
            let tmp = &mut self.tmp;
            tmp[..r].iter_mut().for_each(|x| *x = 0.0);
            for s in 0..r {
                let ars = a[r * CHUNK + s];
                tmp[s] -= ars;
                for c in 0..s {
                    tmp[c] -= ars * a[s * CHUNK + c];
                }
            }
            a[r * CHUNK..r * CHUNK + r].copy_from_slice(&tmp[..r]);
        }
        // 3) W = T diag(β e^γ) K and U = T diag(β) V.
        for r in 0..n {
            let (wr, ur) = (&mut self.w[r * kd..(r + 1) * kd], &mut self.u[r * vd..(r + 1) * vd]);
            wr.iter_mut().for_each(|x| *x = 0.0);
            ur.iter_mut().for_each(|x| *x = 0.0);
            for s in 0..=r {
                let trs = if s == r { 1.0 } else { a[r * CHUNK + s] };
                let bs = trs * self.beta[s];
                axpy(bs * gm[s].exp(), &k[s * kd..(s + 1) * kd], wr);
                axpy(bs, &self.v[s * vd..(s + 1) * vd], ur);
            }
        }
        // 4) Vnew = U − W S (state at chunk start).
        for r in 0..n {
            let ur = &mut self.u[r * vd..(r + 1) * vd];
            for i in 0..kd {
                let wri = self.w[r * kd + i];
                if wri != 0.0 {
                    axpy(-wri, &state[i * vd..(i + 1) * vd], ur);
                }
            }
        }
        // 5) o_r = e^{γ_r} q_r S + Σ_{s≤r} (q_r·k_s) e^{γ_r−γ_s} Vnew_s (q pre-scaled).
        for r in 0..n {
            let or = &mut o[r * vd..(r + 1) * vd];
            or.iter_mut().for_each(|x| *x = 0.0);
            let qr = &q[r * kd..(r + 1) * kd];
            let er = gm[r].exp();
            for (i, &qi) in qr.iter().enumerate() {
                if qi != 0.0 {
                    axpy(qi * er, &state[i * vd..(i + 1) * vd], or);
                }
            }
            for s in 0..=r {
                let p = dot(qr, &k[s * kd..(s + 1) * kd]) * (gm[r] - gm[s]).exp();
                axpy(p, &self.u[s * vd..(s + 1) * vd], or);
            }
        }
        // 6) S ← e^{γ_last} S + Σ_r k_r ⊗ (Vnew_r e^{γ_last−γ_r}).
        let last = gm[n - 1];
        let el = last.exp();
        if el != 1.0 {
            state.iter_mut().for_each(|x| *x *= el);
        }
        for r in 0..n {
            let f = (last - gm[r]).exp();
            let ur = &self.u[r * vd..(r + 1) * vd];
            for i in 0..kd {
                let kri = k[r * kd + i] * f;
                if kri != 0.0 {
                    axpy(kri, ur, &mut state[i * vd..(i + 1) * vd]);
                }
            }
        }
    }
}

/// One decode step for a batch: row `b` of the inputs (`q` `[B, H, K]`, `k` `[B·n, H, K]`,
/// `v` `[B·n, HV, V]`, `beta` `[B·n, HV]`, `g` `[B, HV]`) takes `n` householder steps on
/// `states[b]` `[HV, K, V]`, the gate before the first and the read-out after the last. Writes
/// `o` `[B, HV, V]`. `d.t` is unused (B comes from `states`).
pub fn step_batch(d: Dims, n: usize, x: Inputs<'_>, scale: f32, states: Vec<&mut [f32]>, o: &mut [f32]) {
    let (kd, vd, grp) = (d.k, d.v, d.group());
    o.par_chunks_mut(d.hv * vd).zip(states).enumerate().for_each(|(b, (ob, s))| {
        for (j, (sh, oj)) in s.chunks_mut(kd * vd).zip(ob.chunks_mut(vd)).enumerate() {
            let hk = j / grp;
            for step in 0..n {
                let row = b * n + step;
                let kk = (row * d.h + hk) * kd;
                let vv = (row * d.hv + j) * vd;
                let g = if step == 0 { x.g.map_or(0.0, |g| g[b * d.hv + j]) } else { 0.0 };
                let qq = (b * d.h + hk) * kd;
                let write = HeadStep { k: &x.k[kk..kk + kd], v: &x.v[vv..vv + vd], beta: x.beta[row * d.hv + j], g };
                let read = (step + 1 == n).then(|| ReadOut { q: &x.q[qq..qq + kd], scale, o: &mut *oj });
                recurrent_head_step(sh, write, read);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny deterministic generator so the tests need no extra crates.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> f32 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        fn vec(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.next()).collect()
        }
    }

    fn normalise_rows(x: &mut [f32], k: usize) {
        for row in x.chunks_mut(k) {
            let n = row.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
            row.iter_mut().for_each(|v| *v /= n);
        }
    }

    fn rel_err(a: &[f32], b: &[f32]) -> f32 {
        let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f32>().sqrt();
        let den: f32 = b.iter().map(|y| y * y).sum::<f32>().sqrt();
        num / den.max(1e-30)
    }

    fn case(t: usize, h: usize, hv: usize, kd: usize, vd: usize, seed: u64) -> (Dims, Vec<Vec<f32>>) {
        let mut r = Lcg(seed);
        let mut q = r.vec(t * h * kd);
        let mut k = r.vec(t * h * kd);
        normalise_rows(&mut q, kd);
        normalise_rows(&mut k, kd);
        let v = r.vec(t * hv * vd);
        let beta: Vec<f32> = r.vec(t * hv).iter().map(|x| 0.5 + 0.49 * x).collect();
        let g: Vec<f32> = r.vec(t * hv).iter().map(|x| -0.3 * (1.0 + x)).collect();
        let s0 = r.vec(hv * kd * vd);
        (Dims { t, h, hv, k: kd, v: vd }, vec![q, k, v, beta, g, s0])
    }

    #[test]
    fn chunked_equals_recurrent_across_chunk_boundaries() {
        for &t in &[1usize, 63, 64, 65, 200] {
            let (d, c) = case(t, 2, 4, 16, 24, 7 + t as u64);
            let x = Inputs { q: &c[0], k: &c[1], v: &c[2], beta: &c[3], g: Some(&c[4]) };
            let (mut s1, mut s2) = (c[5].clone(), c[5].clone());
            let (mut o1, mut o2) = (vec![0.0; t * d.hv * d.v], vec![0.0; t * d.hv * d.v]);
            recurrent_gated_delta_rule(d, x, 0.25, &mut s1, &mut o1);
            chunk_gated_delta_rule(d, x, 0.25, &mut s2, &mut o2);
            assert!(rel_err(&o2, &o1) < 1e-5, "t={t} o err {}", rel_err(&o2, &o1));
            assert!(rel_err(&s2, &s1) < 1e-5, "t={t} state err {}", rel_err(&s2, &s1));
        }
    }

    #[test]
    fn no_gate_equals_zero_gate() {
        let (d, c) = case(70, 1, 1, 8, 8, 3);
        let zeros = vec![0f32; 70];
        let mk = |g| Inputs { q: &c[0], k: &c[1], v: &c[2], beta: &c[3], g };
        let (mut s1, mut s2) = (c[5].clone(), c[5].clone());
        let (mut o1, mut o2) = (vec![0.0; 70 * 8], vec![0.0; 70 * 8]);
        chunk_gated_delta_rule(d, mk(None), 1.0, &mut s1, &mut o1);
        chunk_gated_delta_rule(d, mk(Some(&zeros)), 1.0, &mut s2, &mut o2);
        assert_eq!(o1, o2);
        assert_eq!(s1, s2);
    }

    #[test]
    fn single_step_matches_hand_computation() {
        // K = V = 1: S' = e^g S + β(v − e^g S k)k, o = S' q scale.
        let (s0, k, v, q, b, g, sc) = (0.5f32, 1.0f32, 2.0f32, 1.0f32, 0.5f32, -0.1f32, 0.7f32);
        let decayed = g.exp() * s0;
        let expect_s = decayed + b * (v - decayed * k) * k;
        let mut s = [s0];
        let mut o = [0f32];
        recurrent_head_step(&mut s, HeadStep { k: &[k], v: &[v], beta: b, g }, Some(ReadOut { q: &[q], scale: sc, o: &mut o }));
        assert!((s[0] - expect_s).abs() < 1e-6);
        assert!((o[0] - expect_s * q * sc).abs() < 1e-6);
    }
}

//! The device-dispatching interface: candle tensors in, candle tensors out, states in slots.
//!
//! Every op returns f32 tensors: the mixer computes in fp32 whatever the activation dtype
//! (model-spec.md "numerics"); callers cast back.

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use crate::cpu::{conv, gated_delta as gd, norm, prep};
use crate::{ConvActivation, GateActivation, KernelError, Result, SlotBuffer};

/// Reads a tensor as contiguous f32 values on the CPU, refusing other devices.
fn cpu_f32(op: &'static str, t: &Tensor) -> Result<Vec<f32>> {
    match t.device() {
        Device::Cpu => Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?),
        d => Err(KernelError::UnsupportedDevice { op, device: format!("{d:?}") }),
    }
}

fn expect_dims(op: &'static str, input: &'static str, t: &Tensor, want: &[usize]) -> Result<()> {
    if t.dims() != want {
        return Err(KernelError::Shape { op, input, expected: format!("{want:?}"), actual: t.dims().to_vec() });
    }
    Ok(())
}

fn dims2(op: &'static str, input: &'static str, t: &Tensor) -> Result<(usize, usize)> {
    t.dims2().map_err(|_| KernelError::Shape { op, input, expected: "a rank-2 tensor".into(), actual: t.dims().to_vec() })
}

/// Causal depthwise conv over a prompt chunk `x` `[T, C]` with `weight` `[C, W]`, continuing
/// from and updating one slot's conv state `[C, W]`. Returns `[T, C]` f32.
pub fn conv_prefill(x: &Tensor, weight: &Tensor, state: &mut [f32], act: ConvActivation) -> Result<Tensor> {
    const OP: &str = "conv_prefill";
    let (t, c) = dims2(OP, "x", x)?;
    let (_, w) = dims2(OP, "weight", weight)?;
    expect_dims(OP, "weight", weight, &[c, w])?;
    if state.len() != c * w {
        return Err(KernelError::Shape { op: OP, input: "state", expected: format!("[{c}, {w}]"), actual: vec![state.len()] });
    }
    let (xs, ws) = (cpu_f32(OP, x)?, cpu_f32(OP, weight)?);
    let mut y = vec![0f32; t * c];
    conv::causal_conv1d_prefill(&xs, &ws, state, c, w, act, &mut y);
    Ok(Tensor::from_vec(y, (t, c), x.device())?)
}

/// One decode step of the causal conv for `B` sequences: `x` `[B, C]`, the conv states of
/// `slots` (one per row, `[C, W]` each) shift in place. Returns `[B, C]` f32.
pub fn conv_step(x: &Tensor, weight: &Tensor, states: &mut SlotBuffer, slots: &[usize], act: ConvActivation) -> Result<Tensor> {
    const OP: &str = "conv_step";
    let (b, c) = dims2(OP, "x", x)?;
    let (_, w) = dims2(OP, "weight", weight)?;
    expect_dims(OP, "weight", weight, &[c, w])?;
    check_rows(OP, b, slots)?;
    if states.per_slot() != c * w {
        return Err(KernelError::Shape {
            op: OP,
            input: "states",
            expected: format!("[{c}, {w}] per slot"),
            actual: vec![states.per_slot()],
        });
    }
    let (xs, ws) = (cpu_f32(OP, x)?, cpu_f32(OP, weight)?);
    let mut y = vec![0f32; b * c];
    let views = states.slots_mut(slots)?;
    y.par_chunks_mut(c).zip(views).enumerate().for_each(|(i, (yr, s))| {
        conv::causal_conv1d_step(&xs[i * c..(i + 1) * c], &ws, s, w, act, yr);
    });
    Ok(Tensor::from_vec(y, (b, c), x.device())?)
}

fn check_rows(op: &'static str, rows: usize, slots: &[usize]) -> Result<()> {
    if rows != slots.len() {
        return Err(KernelError::Shape { op, input: "slots", expected: format!("{rows} slot indices"), actual: vec![slots.len()] });
    }
    Ok(())
}

/// L2-normalises the last dim of `x` in fp32 (`x / sqrt(Σx² + 1e-6)`). Returns f32.
pub fn l2norm(x: &Tensor) -> Result<Tensor> {
    let dim = x.dims().last().copied().unwrap_or(1);
    let mut v = cpu_f32("l2norm", x)?;
    prep::l2norm_rows(&mut v, dim);
    Ok(Tensor::from_vec(v, x.shape(), x.device())?)
}

/// β = sigmoid(b) (×2 with `allow_neg_eigval`), in fp32. Returns f32 of `b`'s shape.
pub fn beta(b: &Tensor, allow_neg_eigval: bool) -> Result<Tensor> {
    let mut v = cpu_f32("beta", b)?;
    prep::beta_in_place(&mut v, allow_neg_eigval);
    Ok(Tensor::from_vec(v, b.shape(), b.device())?)
}

/// Log-decay `g = −exp(A_log)·softplus(a + dt_bias)` in fp32 for `a` `[T, HV]`.
pub fn gate(a: &Tensor, a_log: &Tensor, dt_bias: &Tensor) -> Result<Tensor> {
    const OP: &str = "gate";
    let (_, hv) = dims2(OP, "a", a)?;
    expect_dims(OP, "A_log", a_log, &[hv])?;
    expect_dims(OP, "dt_bias", dt_bias, &[hv])?;
    let mut v = cpu_f32(OP, a)?;
    prep::gate_in_place(&mut v, &cpu_f32(OP, a_log)?, &cpu_f32(OP, dt_bias)?);
    Ok(Tensor::from_vec(v, a.shape(), a.device())?)
}

/// Output RMSNorm over the last dim, gated by `z` when given (§1.3 step 9). Returns f32.
pub fn gated_rms_norm(x: &Tensor, z: Option<&Tensor>, weight: &Tensor, eps: f32, act: GateActivation) -> Result<Tensor> {
    const OP: &str = "gated_rms_norm";
    let dim = weight.dims1().map_err(|_| KernelError::Shape {
        op: OP,
        input: "weight",
        expected: "rank 1".into(),
        actual: weight.dims().to_vec(),
    })?;
    if x.dims().last() != Some(&dim) {
        return Err(KernelError::Shape { op: OP, input: "x", expected: format!("last dim {dim}"), actual: x.dims().to_vec() });
    }
    let mut v = cpu_f32(OP, x)?;
    let zs = match z {
        Some(z) => {
            expect_dims(OP, "z", z, x.dims())?;
            Some(cpu_f32(OP, z)?)
        }
        None => None,
    };
    norm::gated_rms_norm(&mut v, zs.as_deref(), &cpu_f32(OP, weight)?, eps, act);
    Ok(Tensor::from_vec(v, x.shape(), x.device())?)
}

/// Which algorithm runs a multi-token prefill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillAlgo {
    /// Chunkwise-parallel WY/UT form, chunk 64 (§3.5).
    Chunked,
    /// Token-by-token recurrence (§3.4); the reference.
    Recurrent,
}

/// Inputs of the gated delta rule / product for `T` tokens and `n` householder steps.
#[derive(Debug, Clone, Copy)]
pub struct MixerInputs<'a> {
    /// `[T, H, K]`, L2-normalised.
    pub q: &'a Tensor,
    /// `[T·n, H, K]`, L2-normalised; row `t·n + j` is step `j` of token `t`.
    pub k: &'a Tensor,
    /// `[T·n, HV, V]`.
    pub v: &'a Tensor,
    /// `[T·n, HV]`.
    pub beta: &'a Tensor,
    /// `[T, HV]` log-decay, applied before a token's first step; `None` for no forget gate.
    pub g: Option<&'a Tensor>,
    /// Householder steps per token (1 for Gated DeltaNet).
    pub n: usize,
    /// Read-out scale, normally `K^-0.5`.
    pub scale: f32,
}

struct Flat {
    d: gd::Dims,
    t: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    beta: Vec<f32>,
    g: Option<Vec<f32>>,
}

impl MixerInputs<'_> {
    fn flatten(&self, op: &'static str) -> Result<Flat> {
        let (t, h, kd) = self.q.dims3().map_err(|_| KernelError::Shape {
            op,
            input: "q",
            expected: "[T, H, K]".into(),
            actual: self.q.dims().to_vec(),
        })?;
        let n = self.n.max(1);
        let (tn, hv, vd) = self.v.dims3().map_err(|_| KernelError::Shape {
            op,
            input: "v",
            expected: "[T·n, HV, V]".into(),
            actual: self.v.dims().to_vec(),
        })?;
        if tn != t * n {
            return Err(KernelError::Shape { op, input: "v", expected: format!("[{}, HV, V]", t * n), actual: self.v.dims().to_vec() });
        }
        if h == 0 || !hv.is_multiple_of(h) {
            return Err(KernelError::Shape { op, input: "v", expected: format!("HV a multiple of H={h}"), actual: self.v.dims().to_vec() });
        }
        expect_dims(op, "k", self.k, &[t * n, h, kd])?;
        expect_dims(op, "beta", self.beta, &[t * n, hv])?;
        if let Some(g) = self.g {
            expect_dims(op, "g", g, &[t, hv])?;
        }
        let g = self.g.map(|g| cpu_f32(op, g)).transpose()?;
        Ok(Flat {
            d: gd::Dims { t: t * n, h, hv, k: kd, v: vd },
            t,
            q: cpu_f32(op, self.q)?,
            k: cpu_f32(op, self.k)?,
            v: cpu_f32(op, self.v)?,
            beta: cpu_f32(op, self.beta)?,
            g,
        })
    }
}

/// Runs the mixer over one sequence from one slot's state `[HV, K, V]` (updated in place).
/// Returns `o` `[T, HV, V]` f32.
pub fn gated_delta_prefill(x: MixerInputs<'_>, state: &mut [f32], algo: PrefillAlgo) -> Result<Tensor> {
    const OP: &str = "gated_delta_prefill";
    let f = x.flatten(OP)?;
    let n = x.n.max(1);
    let per_state = f.d.hv * f.d.k * f.d.v;
    if state.len() != per_state {
        return Err(KernelError::Shape {
            op: OP,
            input: "state",
            expected: format!("[{}, {}, {}]", f.d.hv, f.d.k, f.d.v),
            actual: vec![state.len()],
        });
    }
    // Gated DeltaProduct = the GDN recurrence on the interleaved sequence (§2.3).
    let (q, g) = if n > 1 { gd::interleave_product(f.t, n, f.d.h, f.d.hv, f.d.k, &f.q, f.g.as_deref()) } else { (f.q, f.g) };
    let inputs = gd::Inputs { q: &q, k: &f.k, v: &f.v, beta: &f.beta, g: g.as_deref() };
    let mut o = vec![0f32; f.d.t * f.d.hv * f.d.v];
    match algo {
        PrefillAlgo::Chunked => gd::chunk_gated_delta_rule(f.d, inputs, x.scale, state, &mut o),
        PrefillAlgo::Recurrent => gd::recurrent_gated_delta_rule(f.d, inputs, x.scale, state, &mut o),
    }
    let o = if n > 1 { gd::take_last_steps(f.t, n, f.d.hv * f.d.v, &o) } else { o };
    Ok(Tensor::from_vec(o, (f.t, f.d.hv, f.d.v), x.q.device())?)
}

/// One decode step for `B` sequences (`T = B` rows, one token each), each reading and
/// writing the recurrent state of its slot in place. Returns `o` `[B, HV, V]` f32.
pub fn gated_delta_step(x: MixerInputs<'_>, states: &mut SlotBuffer, slots: &[usize]) -> Result<Tensor> {
    const OP: &str = "gated_delta_step";
    let f = x.flatten(OP)?;
    let n = x.n.max(1);
    let d = f.d;
    check_rows(OP, f.t, slots)?;
    if states.per_slot() != d.hv * d.k * d.v {
        return Err(KernelError::Shape {
            op: OP,
            input: "states",
            expected: format!("[{}, {}, {}] per slot", d.hv, d.k, d.v),
            actual: vec![states.per_slot()],
        });
    }
    let (kd, vd, grp) = (d.k, d.v, d.hv / d.h);
    let mut o = vec![0f32; f.t * d.hv * vd];
    let views = states.slots_mut(slots)?;
    o.par_chunks_mut(d.hv * vd).zip(views).enumerate().for_each(|(b, (ob, s))| {
        for (j, (sh, oj)) in s.chunks_mut(kd * vd).zip(ob.chunks_mut(vd)).enumerate() {
            let hk = j / grp;
            for step in 0..n {
                let row = b * n + step;
                let kk = (row * d.h + hk) * kd;
                let vv = (row * d.hv + j) * vd;
                let g = if step == 0 { f.g.as_ref().map_or(0.0, |g| g[b * d.hv + j]) } else { 0.0 };
                let last = step + 1 == n;
                let qq = (b * d.h + hk) * kd;
                let step = gd::HeadStep { k: &f.k[kk..kk + kd], v: &f.v[vv..vv + vd], beta: f.beta[row * d.hv + j], g };
                let read = last.then(|| gd::ReadOut { q: &f.q[qq..qq + kd], scale: x.scale, o: &mut *oj });
                gd::recurrent_head_step(sh, step, read);
            }
        }
    });
    Ok(Tensor::from_vec(o, (f.t, d.hv, vd), x.q.device())?)
}

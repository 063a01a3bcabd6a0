//! Causal depthwise conv1d + SiLU with a rolling input state (model-spec.md §1.3 step 2, §3.3, §3.4).
//!
//! Layouts: inputs `[T, C]` token-major; `weight` `[C, W]` where tap `W-1` multiplies the
//! current token (PyTorch cross-correlation with left padding); `state` `[C, W]` holds the
//! last W raw (pre-conv) inputs, oldest first.

use rayon::prelude::*;

#[inline]
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Whether the conv output goes through SiLU (fla's `ShortConvolution(activation="silu")`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvActivation {
    /// `y = silu(conv(x))`.
    Silu,
    /// `y = conv(x)`.
    Identity,
}

impl ConvActivation {
    #[inline]
    fn apply(self, x: f32) -> f32 {
        match self {
            ConvActivation::Silu => silu(x),
            ConvActivation::Identity => x,
        }
    }
}

/// Prefill: convolves `x` `[T, C]` continuing from `state`, writes `y` `[T, C]` and leaves
/// the last W inputs in `state` (older ones shift in from the previous state when T < W).
pub fn causal_conv1d_prefill(x: &[f32], weight: &[f32], state: &mut [f32], c: usize, w: usize, act: ConvActivation, y: &mut [f32]) {
    let t = x.len() / c;
    // Input at position p ∈ [-(W), T): negative positions come from the state.
    let input = |p: isize, ch: usize, state: &[f32]| -> f32 {
        if p >= 0 {
            x[p as usize * c + ch]
        } else {
            state[ch * w + (w as isize + p) as usize]
        }
    };
    for tt in 0..t {
        for ch in 0..c {
            let mut acc = 0f32;
            for tap in 0..w {
                let p = tt as isize - (w as isize - 1) + tap as isize;
                acc += weight[ch * w + tap] * input(p, ch, state);
            }
            y[tt * c + ch] = act.apply(acc);
        }
    }
    // New state: the last W inputs of (old state ++ x).
    let mut next = vec![0f32; c * w];
    for ch in 0..c {
        for slot in 0..w {
            let p = t as isize - w as isize + slot as isize;
            next[ch * w + slot] = input(p, ch, state);
        }
    }
    state.copy_from_slice(&next);
}

/// Prefill of packed sequences: rows `cu[s]..cu[s+1]` of `x` `[ΣT, C]` continue `states[s]`;
/// writes `y` `[ΣT, C]`. `weight` is `[C, W]`.
pub fn causal_conv1d_prefill_packed(
    x: &[f32],
    weight: &[f32],
    w: usize,
    act: ConvActivation,
    states: Vec<&mut [f32]>,
    cu: &[usize],
    y: &mut [f32],
) {
    let c = weight.len() / w.max(1);
    for (s, state) in states.into_iter().enumerate() {
        let (a, b) = (cu[s] * c, cu[s + 1] * c);
        causal_conv1d_prefill(&x[a..b], weight, state, c, w, act, &mut y[a..b]);
    }
}

/// Decode for a batch: row `i` of `x` `[B, C]` shifts into `states[i]`; writes `y` `[B, C]`.
pub fn causal_conv1d_step_batch(
    x: &[f32],
    weight: &[f32],
    states: Vec<&mut [f32]>,
    c: usize,
    w: usize,
    act: ConvActivation,
    y: &mut [f32],
) {
    y.par_chunks_mut(c).zip(states).enumerate().for_each(|(i, (yr, s))| {
        causal_conv1d_step(&x[i * c..(i + 1) * c], weight, s, w, act, yr);
    });
}

/// Decode: shifts one new input `x` `[C]` into `state` in place and writes `y` `[C]`.
pub fn causal_conv1d_step(x: &[f32], weight: &[f32], state: &mut [f32], w: usize, act: ConvActivation, y: &mut [f32]) {
    for (ch, (&xc, yc)) in x.iter().zip(y.iter_mut()).enumerate() {
        let s = &mut state[ch * w..(ch + 1) * w];
        s.copy_within(1.., 0);
        s[w - 1] = xc;
        let acc: f32 = s.iter().zip(&weight[ch * w..(ch + 1) * w]).map(|(a, b)| a * b).sum();
        *yc = act.apply(acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_then_steps_equals_one_prefill() {
        let (c, w, t) = (3, 4, 9);
        let x: Vec<f32> = (0..t * c).map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0).collect();
        let weight: Vec<f32> = (0..c * w).map(|i| ((i * 5 % 7) as f32 - 3.0) / 4.0).collect();
        let mut s_full = vec![0f32; c * w];
        let mut y_full = vec![0f32; t * c];
        causal_conv1d_prefill(&x, &weight, &mut s_full, c, w, ConvActivation::Silu, &mut y_full);

        let split = 2; // shorter than W: the state must carry the zero padding forward
        let mut s = vec![0f32; c * w];
        let mut y = vec![0f32; t * c];
        causal_conv1d_prefill(&x[..split * c], &weight, &mut s, c, w, ConvActivation::Silu, &mut y[..split * c]);
        for tt in split..t {
            causal_conv1d_step(&x[tt * c..(tt + 1) * c], &weight, &mut s, w, ConvActivation::Silu, &mut y[tt * c..(tt + 1) * c]);
        }
        assert_eq!(s, s_full);
        for (a, b) in y.iter().zip(&y_full) {
            assert!((a - b).abs() < 1e-6);
        }
    }

    #[test]
    fn last_tap_multiplies_current_token() {
        // weight = [0, 0, 0, 1]: identity conv → y = x.
        let x = [1.0f32, -2.0, 3.0];
        let mut s = vec![0f32; 4];
        let mut y = [0f32; 3];
        causal_conv1d_prefill(&x, &[0.0, 0.0, 0.0, 1.0], &mut s, 1, 4, ConvActivation::Identity, &mut y);
        assert_eq!(y, x);
        assert_eq!(s, vec![0.0, 1.0, -2.0, 3.0]);
    }
}

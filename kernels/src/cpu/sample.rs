//! The sampling rule on one row of logits; `cuda/sample.cu` runs the same rule with the same
//! random numbers.
//!
//! The draw is a Gumbel-max race: token = argmax over the kept tokens of `s_i + g_i`, where
//! `s_i = (x_i − max x) / T` and `g_i = −ln(−ln u_i)` with `u_i` uniform, which picks token i with
//! probability `softmax(s)_i` renormalised over the kept set. Every token gets its own random
//! number from `(seed, draw, token)`, so rows are independent of each other and of the batch,
//! and the draw needs no sort and no prefix sum. The top-k and top-p cuts are thresholds on an
//! order-preserving integer key of `s`, found by bisection over the key's 32 bits (32
//! counting passes), which a GPU block does with reductions.

use crate::ops::sample::{Adjust, Drawn, Outcome, RowRule};

/// splitmix64's increment.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's finaliser.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The start of draw `draw`'s random stream under `seed`.
pub fn stream(seed: u64, draw: u64) -> u64 {
    mix(seed ^ mix(draw.wrapping_add(GAMMA)))
}

/// Token `i`'s uniform number in (0, 1) on the stream `base` (24 random bits, centred).
pub fn uniform(base: u64, i: u32) -> f32 {
    let z = mix(base.wrapping_add((i as u64 + 1).wrapping_mul(GAMMA)));
    ((z >> 40) as f32 + 0.5) * (1.0 / 16_777_216.0)
}

/// An order-preserving key of a non-NaN float: a larger float has a larger key, and every
/// float's key is above 0 (which marks a token out of the draw).
pub fn key(s: f32) -> u32 {
    let b = s.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// The largest threshold `t` for which `holds(t)` is true, `holds` being true at 0 and
/// monotone (true below some point, false above): one bit at a time from the top.
fn largest(holds: impl Fn(u32) -> bool) -> u32 {
    let mut t = 0u32;
    for b in (0..32).rev() {
        let c = t | (1 << b);
        if holds(c) {
            t = c;
        }
    }
    t
}

/// Draws from `raw` (one row of the model's logits) under `rule`, with the row's adjustments
/// and optional bitmask.
pub fn draw(raw: &[f32], rule: &RowRule, adjust: &[Adjust], mask: Option<&[u32]>) -> Outcome {
    let bad = raw.iter().filter(|l| !l.is_finite()).count();
    if bad > 0 {
        let first = raw.iter().position(|l| !l.is_finite()).unwrap_or(0);
        return Outcome::NonFinite { count: bad, first };
    }
    let max = raw.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // Sums over a vocabulary run in f64: an f32 running sum of 150k terms drifts by ~1e-4.
    let lse = (raw.iter().map(|&l| ((l - max) as f64).exp()).sum::<f64>().ln() + max as f64) as f32;

    let mut x = raw.to_vec();
    if let Some(m) = mask {
        super::bitmask::apply(m, &mut x);
    }
    for a in adjust {
        if let Some(v) = x.get_mut(a.token as usize).filter(|v| v.is_finite()) {
            *v = adjusted(*v, a);
        }
    }
    // The largest allowed logit, lowest id on ties.
    let mut best: Option<usize> = None;
    for (i, &v) in x.iter().enumerate() {
        if v.is_finite() && best.is_none_or(|b| v > x[b]) {
            best = Some(i);
        }
    }
    let Some(best) = best else { return Outcome::NothingAllowed };
    let token = if rule.temperature == 0.0 { best as u32 } else { race(&x, x[best], rule) };
    Outcome::Token(Drawn { token, logprob: raw[token as usize] - lse, top: top(raw, lse, rule.top_logprobs as usize) })
}

/// One adjustment applied to a logit.
fn adjusted(v: f32, a: &Adjust) -> f32 {
    let mut v = v + a.bias;
    if a.repetition != 1.0 {
        v = if v > 0.0 { v / a.repetition } else { v * a.repetition };
    }
    v - a.subtract
}

/// The Gumbel race over the tokens the top-k, min-p and top-p cuts keep (`m` = max of `x`).
fn race(x: &[f32], m: f32, rule: &RowRule) -> u32 {
    let s: Vec<f32> = x.iter().map(|&v| if v.is_finite() { (v - m) / rule.temperature } else { f32::NEG_INFINITY }).collect();
    let keys: Vec<u32> = s.iter().map(|&v| if v.is_finite() { key(v) } else { 0 }).collect();
    let allowed = keys.iter().filter(|&&k| k > 0).count();
    let mut cut = 1u32;
    if rule.top_k > 0 && (rule.top_k as usize) < allowed {
        cut = cut.max(largest(|c| keys.iter().filter(|&&k| k >= c).count() >= rule.top_k as usize));
    }
    if rule.ln_min_p > f32::NEG_INFINITY {
        cut = cut.max(key(rule.ln_min_p));
    }
    if rule.top_p < 1.0 {
        let mass = |c: u32| s.iter().zip(&keys).filter(|(_, &k)| k >= c).map(|(&v, _)| (v as f64).exp()).sum::<f64>();
        let target = rule.top_p as f64 * mass(cut);
        cut = cut.max(largest(|c| mass(c.max(cut)) >= target));
    }
    let base = stream(rule.seed, rule.draw);
    let mut best = (f32::NEG_INFINITY, 0u32);
    for (i, (&v, &k)) in s.iter().zip(&keys).enumerate() {
        if k >= cut {
            let g = -(-uniform(base, i as u32).ln()).ln();
            let score = v + g;
            if score > best.0 {
                best = (score, i as u32);
            }
        }
    }
    best.1
}

/// The `n` largest of `raw` as (token, logprob), most likely first, lower id first on ties.
fn top(raw: &[f32], lse: f32, n: usize) -> Vec<(u32, f32)> {
    let n = n.min(raw.len());
    if n == 0 {
        return vec![];
    }
    let mut idx: Vec<u32> = (0..raw.len() as u32).collect();
    let order = |a: &u32, b: &u32| raw[*b as usize].total_cmp(&raw[*a as usize]).then(a.cmp(b));
    idx.select_nth_unstable_by(n - 1, order);
    idx.truncate(n);
    idx.sort_by(order);
    idx.into_iter().map(|i| (i, raw[i as usize] - lse)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> RowRule {
        RowRule { seed: 11, ..RowRule::default() }
    }

    fn token(o: Outcome) -> u32 {
        match o {
            Outcome::Token(d) => d.token,
            o => panic!("no token: {o:?}"),
        }
    }

    /// Frequencies of `n` draws (draw counters 0..n).
    fn frequencies(raw: &[f32], r: RowRule, adjust: &[Adjust], mask: Option<&[u32]>, n: u64) -> Vec<f64> {
        let mut f = vec![0.0; raw.len()];
        for d in 0..n {
            f[token(draw(raw, &RowRule { draw: d, ..r }, adjust, mask)) as usize] += 1.0 / n as f64;
        }
        f
    }

    /// `ln` of probabilities written out by hand.
    fn logits(p: &[f64]) -> Vec<f32> {
        p.iter().map(|&p| p.ln() as f32).collect()
    }

    fn close(got: &[f64], want: &[f64], tol: f64) {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= tol, "token {i}: frequency {g:.4}, expected {w:.4} (all: {got:?})");
        }
    }

    #[test]
    fn uniforms_are_uniform_and_keys_keep_order() {
        let base = stream(5, 9);
        let u: Vec<f32> = (0..100_000).map(|i| uniform(base, i)).collect();
        assert!(u.iter().all(|&u| u > 0.0 && u < 1.0));
        let mean = u.iter().map(|&u| u as f64).sum::<f64>() / u.len() as f64;
        assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
        let below = u.iter().filter(|&&u| u < 0.1).count() as f64 / u.len() as f64;
        assert!((below - 0.1).abs() < 0.005, "P(u < 0.1) = {below}");
        assert_ne!(stream(5, 9), stream(5, 10));
        let xs = [f32::NEG_INFINITY, -1e30, -2.5, -1e-30, -0.0, 0.0, 1e-30, 3.0, f32::INFINITY];
        assert!(xs.windows(2).all(|w| key(w[0]) <= key(w[1])) && key(f32::NEG_INFINITY) > 0);
    }

    #[test]
    fn draws_follow_the_softmax_at_each_temperature() {
        let p = [0.5, 0.25, 0.15, 0.1];
        let raw = logits(&p);
        close(&frequencies(&raw, rule(), &[], None, 20_000), &p, 0.015);
        // T = 2 flattens: p_i ∝ sqrt(p_i).
        let z: f64 = p.iter().map(|p| p.sqrt()).sum();
        let want: Vec<f64> = p.iter().map(|p| p.sqrt() / z).collect();
        close(&frequencies(&raw, RowRule { temperature: 2.0, ..rule() }, &[], None, 20_000), &want, 0.015);
    }

    #[test]
    fn top_k_top_p_and_min_p_renormalise_over_what_they_keep() {
        let p = [0.4, 0.3, 0.2, 0.1];
        let raw = logits(&p);
        // top-k 2 → {0.4, 0.3} renormalised.
        close(&frequencies(&raw, RowRule { top_k: 2, ..rule() }, &[], None, 20_000), &[4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0], 0.015);
        // top-p 0.75: 0.4 + 0.3 = 0.7 < 0.75, so the third is kept too.
        close(&frequencies(&raw, RowRule { top_p: 0.75, ..rule() }, &[], None, 20_000), &[4.0 / 9.0, 3.0 / 9.0, 2.0 / 9.0, 0.0], 0.015);
        // min-p 0.5 keeps p ≥ 0.2.
        let ln_min_p = 0.5f32.ln();
        close(&frequencies(&raw, RowRule { ln_min_p, ..rule() }, &[], None, 20_000), &[4.0 / 9.0, 3.0 / 9.0, 2.0 / 9.0, 0.0], 0.015);
        // top-k 1 is greedy; top_p keeps at least the most likely.
        assert!(frequencies(&raw, RowRule { top_k: 1, ..rule() }, &[], None, 200)[0] > 0.999);
        assert!(frequencies(&raw, RowRule { top_p: 0.01, ..rule() }, &[], None, 200)[0] > 0.999);
    }

    #[test]
    fn ties_at_a_cut_are_kept() {
        let raw = [1.0f32, 2.0, 2.0, 0.0];
        let f = frequencies(&raw, RowRule { top_k: 1, ..rule() }, &[], None, 4_000);
        assert!(f[0] == 0.0 && f[3] == 0.0 && (f[1] - 0.5).abs() < 0.04, "{f:?}");
    }

    #[test]
    fn greedy_takes_the_largest_lowest_id_first_and_reports_the_model_logprob() {
        let raw = [0.0f32, 3.0, 3.0, 1.0];
        let g = RowRule { temperature: 0.0, top_logprobs: 3, ..rule() };
        let Outcome::Token(d) = draw(&raw, &g, &[], None) else { panic!() };
        let lse = (1.0f64 + 2.0 * 3f64.exp() + 1f64.exp()).ln();
        assert_eq!(d.token, 1);
        assert!((d.logprob as f64 - (3.0 - lse)).abs() < 1e-6);
        assert_eq!(d.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert!((d.top[2].1 as f64 - (1.0 - lse)).abs() < 1e-6);
    }

    #[test]
    fn masks_and_adjustments_steer_the_draw_but_not_the_logprob() {
        let raw = [2.0f32, 1.0, 0.5, -1.0];
        let g = RowRule { temperature: 0.0, ..rule() };
        // Only tokens 1 and 3 allowed.
        assert_eq!(token(draw(&raw, &g, &[], Some(&[0b1010]))), 1);
        let f = frequencies(&raw, rule(), &[], Some(&[0b1010]), 4_000);
        assert!(f[0] == 0.0 && f[2] == 0.0 && (f[1] - 1.0 / (1.0 + (-2f64).exp())).abs() < 0.03, "{f:?}");
        // bias +2 on token 2 → 2.5 beats 2.0; repetition 4 on token 0 → 0.5; presence 1.5 → 0.5.
        let bias = Adjust { token: 2, bias: 2.0, repetition: 1.0, subtract: 0.0 };
        assert_eq!(token(draw(&raw, &g, &[bias], None)), 2);
        let rep = Adjust { token: 0, bias: 0.0, repetition: 4.0, subtract: 0.0 };
        assert_eq!(token(draw(&raw, &g, &[rep], None)), 1);
        let neg = Adjust { token: 3, bias: 0.0, repetition: 4.0, subtract: 0.0 };
        let Outcome::Token(d) = draw(&[-1.0, -1.5], &g, &[Adjust { token: 0, ..neg }], None) else { panic!() };
        assert_eq!(d.token, 1, "a negative logit is multiplied by the penalty");
        let lse = ((-1f64).exp() + (-1.5f64).exp()).ln();
        assert!((d.logprob as f64 - (-1.5 - lse)).abs() < 1e-6, "the logprob is the model's");
        let presence = Adjust { token: 0, bias: 0.0, repetition: 1.0, subtract: 1.5 };
        assert_eq!(token(draw(&raw, &g, &[presence], None)), 1);
        // A mask that leaves nothing.
        assert_eq!(draw(&raw, &g, &[], Some(&[0])), Outcome::NothingAllowed);
    }

    #[test]
    fn non_finite_logits_are_reported_not_drawn_from() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!(draw(&[0.0, bad, 1.0, bad], &rule(), &[], None), Outcome::NonFinite { count: 2, first: 1 });
        }
    }

    #[test]
    fn seeds_and_draws_reproduce_and_differ() {
        let raw: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |seed| (0..40).map(|d| token(draw(&raw, &RowRule { seed, draw: d, ..rule() }, &[], None))).collect::<Vec<_>>();
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        // A tiny temperature is still a valid draw, of the largest.
        let t = RowRule { temperature: 1e-5, ..rule() };
        assert_eq!(token(draw(&[0.5, 3.0, -1.0, 2.0], &t, &[], None)), 1);
    }
}

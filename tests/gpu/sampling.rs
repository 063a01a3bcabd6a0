//! The batched sampler on the GPU against its CPU twin, at Qwen's vocabulary size.

use candle_core::{Device, Tensor};
use deltaserve_kernels::ops::sample::{sample, Adjust, Drawn, Outcome, RowRule, SampleBatch};
use rand::{Rng, SeedableRng};

fn rule(row: u32, seed: u64) -> RowRule {
    RowRule { row, seed, ..RowRule::default() }
}

fn drawn(o: &Outcome) -> &Drawn {
    match o {
        Outcome::Token(d) => d,
        o => panic!("no token: {o:?}"),
    }
}

/// 64 rows of 151,643 logits, every kind of rule (greedy, temperature, top-k, top-p, min-p,
/// masks, adjustments, top logprobs, a NaN row, a row masked to nothing), eight draws each:
/// the same statuses, greedy tokens and log-probabilities as the CPU's; drawn tokens the same
/// wherever rounding of `exp`/`ln` does not decide (≥ 99% of draws).
pub fn gpu_sampling_matches_cpu(dev: &Device) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let (b, v) = (64usize, 151_643usize);
    let mut logits: Vec<f32> = (0..b * v).map(|_| rng.random_range(-4.0f32..4.0)).collect();
    // A few strong tokens a row, so that the cuts keep tens of tokens, not thousands. Half the
    // top-k and top-p rows are peaked as a trained model's are (their strong tokens far above
    // the rest: the kernel's shared-memory searches); the others spread (its searches over the
    // whole row).
    for r in 0..b {
        let lift = if matches!(r % 16, 1 | 2 | 4) { 20.0f32..28.0 } else { 6.0..14.0 };
        for _ in 0..40 {
            logits[r * v + rng.random_range(0..v)] += rng.random_range(lift.clone());
        }
    }
    logits[7 * v + 1234] = f32::NAN;
    let cpu = Tensor::from_vec(logits, (b, v), &Device::Cpu).unwrap();
    let gpu = cpu.to_device(dev).unwrap();
    let words = v.div_ceil(32);
    let masks: Vec<u32> = (0..2 * words).map(|i| if i < words { rng.random::<u32>() & rng.random::<u32>() } else { 0 }).collect();
    let adjust: Vec<Adjust> = (0..50)
        .map(|i| Adjust { token: rng.random_range(0..v as u32), bias: (i % 5) as f32 - 2.0, repetition: 1.3, subtract: 0.4 })
        .collect();
    let mut rules = Vec::new();
    for r in 0..b as u32 {
        let mut x = rule(r, 1000 + r as u64);
        match r % 8 {
            0 => x.temperature = 0.0,
            1 => x.top_k = 1 + r * 3,
            2 => x.top_p = 0.3 + 0.01 * r as f32,
            3 => x.ln_min_p = (0.05f32 + 0.002 * r as f32).ln(),
            4 => x = RowRule { temperature: 0.7, top_k: 50, top_p: 0.9, ln_min_p: 0.02f32.ln(), ..x },
            5 => x = RowRule { mask: Some(0), top_p: 0.95, ..x },
            6 => x = RowRule { adjust_from: r % 10, adjust_len: 40, temperature: 0.0, ..x },
            _ => x.temperature = 1.5,
        }
        x.top_logprobs = [0, 1, 5, 20][r as usize % 4];
        rules.push(x);
    }
    rules.push(RowRule { mask: Some(1), ..rule(3, 1) });
    let mut same = 0;
    let mut total = 0;
    for draw in 0..8u64 {
        let rs: Vec<RowRule> = rules.iter().map(|r| RowRule { draw, ..*r }).collect();
        let batch = SampleBatch { rules: &rs, adjust: &adjust, masks: &masks, words };
        let want = sample(&cpu, &batch).unwrap();
        let got = sample(&gpu, &batch).unwrap();
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            let r = &rs[i];
            match (w, g) {
                (Outcome::Token(w), Outcome::Token(g)) => {
                    assert!((w.logprob - g.logprob).abs() < 1e-4 || w.token != g.token, "row {i}: logprob {} vs {}", g.logprob, w.logprob);
                    assert_eq!(w.top.len(), g.top.len(), "row {i}");
                    for (a, c) in w.top.iter().zip(&g.top) {
                        assert!(a.0 == c.0 && (a.1 - c.1).abs() < 1e-4, "row {i}: top {a:?} vs {c:?}");
                    }
                    if r.temperature == 0.0 {
                        assert_eq!(w.token, g.token, "row {i}: greedy");
                    }
                    if let Some(m) = r.mask {
                        let t = g.token as usize;
                        assert!(masks[m as usize * words + t / 32] >> (t % 32) & 1 == 1, "row {i}: token {t} is masked");
                    }
                    same += (w.token == g.token) as usize;
                    total += 1;
                }
                (w, g) => assert_eq!(w, g, "row {i}"),
            }
        }
        assert!(matches!(got[7], Outcome::NonFinite { count: 1, first: 1234 }), "{:?}", got[7]);
        assert_eq!(got[b], Outcome::NothingAllowed);
    }
    println!("  drawn tokens equal to the CPU's: {same} of {total}");
    assert!(same * 100 >= total * 99, "{same} of {total}");
}

/// 20,000 draws from one row on the GPU follow the probabilities written out by hand, with
/// and without a top-p cut.
pub fn gpu_sampling_follows_the_distribution(dev: &Device) {
    let p = [0.4f64, 0.3, 0.2, 0.06, 0.04];
    let mut row: Vec<f32> = vec![-1e4; 1000];
    for (i, p) in p.iter().enumerate() {
        row[100 * i + 3] = p.ln() as f32;
    }
    let logits = Tensor::from_vec(row, (1, 1000), dev).unwrap();
    let n = 20_000u64;
    for (top_p, want) in [(1.0f32, p.to_vec()), (0.85, vec![0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0.0, 0.0])] {
        let rules: Vec<RowRule> = (0..n).map(|d| RowRule { draw: d, top_p, ..rule(0, 77) }).collect();
        let out = sample(&logits, &SampleBatch { rules: &rules, adjust: &[], masks: &[], words: 0 }).unwrap();
        let mut f = [0f64; 5];
        for o in &out {
            let t = drawn(o).token as usize;
            assert!(t % 100 == 3 && t / 100 < 5, "token {t}");
            f[t / 100] += 1.0 / n as f64;
        }
        for (g, w) in f.iter().zip(&want) {
            // Four standard deviations of a frequency over n draws.
            let tol = 4.0 * (w * (1.0 - w) / n as f64).sqrt() + 1e-9;
            assert!((g - w).abs() <= tol, "top_p {top_p}: frequencies {f:?}, expected {want:?}");
        }
    }
}

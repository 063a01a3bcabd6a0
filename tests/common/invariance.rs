//! Batch invariance: a sequence's logits alone against the same sequence in batches, for the
//! CPU test (`batch_invariance.rs`) and the GPU's (`gpu.rs`).

use deltaserve_engine::{CausalLm, Logits, PrefillAlgo, SlotId, StatePool};
use rand::{Rng, SeedableRng};

use crate::values;

/// Decode steps compared after the prompt.
const STEPS: usize = 3;

pub fn tokens(rng: &mut impl Rng, vocab: usize, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
}

/// The logits after the prompt (prefilled with `algo`) and after each of `next`, for `prompt`
/// alone in a one-slot pool.
fn alone(m: &CausalLm, prompt: &[u32], next: &[u32], algo: PrefillAlgo) -> Vec<Vec<f32>> {
    let mut pool = m.new_pool(1).unwrap();
    let s = pool.allocate().unwrap();
    let mut out = vec![values(&m.prefill(&mut pool, s, prompt, Logits::Last, algo).unwrap())];
    for &t in next {
        out.push(values(&m.decode(&mut pool, &[(s, t)]).unwrap()));
    }
    out
}

/// The same, with `prompt` packed into one prefill among `others` at row `at`, then decoded
/// in batches with the others at batch row `at`, the target in slot `slot_skip` of the pool.
fn in_batch(m: &CausalLm, prompt: &[u32], next: &[u32], others: &[Vec<u32>], at: usize, slot_skip: usize) -> Vec<Vec<f32>> {
    let v = m.config().common.vocab_size;
    let mut pool = m.new_pool(others.len() + 1 + slot_skip).unwrap();
    let spare: Vec<SlotId> = (0..slot_skip).map(|_| pool.allocate().unwrap()).collect();
    let mut slots: Vec<SlotId> = (0..others.len() + 1).map(|_| pool.allocate().unwrap()).collect();
    let n = slots.len();
    slots.rotate_left(at % n);
    let mut seqs: Vec<&[u32]> = others.iter().map(Vec::as_slice).collect();
    seqs.insert(at, prompt);
    let batch: Vec<(SlotId, &[u32])> = slots.iter().copied().zip(seqs).collect();
    let first = values(&m.prefill_many(&mut pool, &batch, PrefillAlgo::Chunked).unwrap());
    let mut out = vec![first[at * v..(at + 1) * v].to_vec()];
    for (step, &t) in next.iter().enumerate() {
        let step_batch: Vec<(SlotId, u32)> =
            slots.iter().enumerate().map(|(i, &s)| (s, if i == at { t } else { (i + step) as u32 % v as u32 })).collect();
        let y = values(&m.decode(&mut pool, &step_batch).unwrap());
        out.push(y[at * v..(at + 1) * v].to_vec());
    }
    drop(spare);
    out
}

/// The same, with the prompt prefilled in a pass that also decodes three running sequences, and
/// each next token decoded (at decode row 1) in a pass that also prefills a new prompt piece;
/// every prompt with `algo`.
fn in_mixed(m: &CausalLm, prompt: &[u32], next: &[u32], others: &[Vec<u32>], algo: PrefillAlgo) -> Vec<Vec<f32>> {
    let v = m.config().common.vocab_size;
    let mut pool = m.new_pool(4 + next.len()).unwrap();
    let running: Vec<SlotId> = (0..3).map(|_| pool.allocate().unwrap()).collect();
    let batch: Vec<(SlotId, &[u32])> = running.iter().copied().zip(others.iter().map(Vec::as_slice)).collect();
    m.prefill_many(&mut pool, &batch, algo).unwrap();
    let s = pool.allocate().unwrap();
    let step: Vec<(SlotId, u32)> = running.iter().map(|&r| (r, 5 % v as u32)).collect();
    let first = values(&m.prefill_and_decode(&mut pool, &[(s, prompt)], algo, &[], &step).unwrap());
    let mut out = vec![first[..v].to_vec()];
    for (i, &t) in next.iter().enumerate() {
        let newcomer = pool.allocate().unwrap();
        let step = [(running[0], 7), (s, t), (running[1], 3), (running[2], 1)];
        let piece = &others[i % others.len()];
        let y = values(&m.prefill_and_decode(&mut pool, &[(newcomer, piece)], algo, &[], &step).unwrap());
        // Row 0 is the new piece's; the decode rows follow.
        out.push(y[2 * v..3 * v].to_vec());
    }
    out
}

/// The worst relative error, over the prompt's logits and 3 decode steps', of a sequence
/// prefilled and decoded in mixed passes (beside running sequences and new prompt pieces)
/// against the same sequence alone, every prompt with `algo`: for GPUs, whose default projections
/// round by row count.
pub fn mixed_error(m: &CausalLm, seed: u64, algo: PrefillAlgo) -> f64 {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let v = m.config().common.vocab_size;
    let (prompt, next) = (tokens(&mut rng, v, 37), tokens(&mut rng, v, STEPS));
    let others: Vec<Vec<u32>> = (0..3).map(|i| tokens(&mut rng, v, 20 + 45 * i)).collect();
    let got = in_mixed(m, &prompt, &next, &others, algo);
    got.iter().zip(alone(m, &prompt, &next, algo)).map(|(g, s)| crate::rel_err(g, &s)).fold(0.0, f64::max)
}

/// `prompt` prefilled in pieces ending at `cuts` (then the rest), then decoded alone.
fn split(m: &CausalLm, pool: &mut StatePool, prompt: &[u32], cuts: &[usize]) -> Vec<f32> {
    let s = pool.allocate().unwrap();
    let mut from = 0;
    let mut last = None;
    for &to in cuts.iter().chain(std::iter::once(&prompt.len())) {
        last = Some(values(&m.prefill(pool, s, &prompt[from..to], Logits::Last, PrefillAlgo::Chunked).unwrap()));
        from = to;
    }
    pool.release(s).unwrap();
    last.unwrap()
}

/// Logits that differ in their bits.
fn differing(a: &[f32], b: &[f32]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count()
}

/// For one model: `(case, logits that differ from alone)` for a 37-token prompt and 3 decode
/// steps packed and decoded in batches of 2, 7 and 32 (in other slots and rows), in passes that
/// prefill and decode at once, and for a 200-token prompt cut at chunk boundaries against the
/// whole.
pub fn batch_differences(m: &CausalLm, seed: u64) -> Vec<(String, usize)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let v = m.config().common.vocab_size;
    let prompt = tokens(&mut rng, v, 37);
    let next = tokens(&mut rng, v, STEPS);
    let solo = alone(m, &prompt, &next, PrefillAlgo::Chunked);
    let mut out = Vec::new();
    for (b, at, skip) in [(2, 1, 0), (7, 3, 2), (32, 31, 5), (32, 0, 1)] {
        let others: Vec<Vec<u32>> = (0..b - 1).map(|i| tokens(&mut rng, v, 1 + (i * 29 + 11) % 150)).collect();
        let got = in_batch(m, &prompt, &next, &others, at, skip);
        for (step, (g, s)) in got.iter().zip(&solo).enumerate() {
            out.push((
                format!("batch of {b} (row {at}), {}", if step == 0 { "packed prefill".into() } else { format!("decode step {step}") }),
                differing(g, s),
            ));
        }
    }
    let others: Vec<Vec<u32>> = (0..3).map(|i| tokens(&mut rng, v, 20 + 45 * i)).collect();
    for (step, (g, s)) in in_mixed(m, &prompt, &next, &others, PrefillAlgo::Chunked).iter().zip(&solo).enumerate() {
        let what = if step == 0 { "prefilled beside 3 decode rows".into() } else { format!("decode step {step} beside a prompt piece") };
        out.push((format!("mixed pass, {what}"), differing(g, s)));
    }
    let long = tokens(&mut rng, v, 200);
    let mut pool = m.new_pool(1).unwrap();
    let whole = split(m, &mut pool, &long, &[]);
    for cuts in [vec![64], vec![128], vec![64, 128, 192], vec![192]] {
        out.push((format!("200-token prompt cut at {cuts:?}"), differing(&split(m, &mut pool, &long, &cuts), &whole)));
    }
    out
}

/// Logits that differ in their bits between a sequence alone and the same sequence prefilled and
/// decoded in mixed passes, every prompt with `algo`: the prompt's logits, then each decode
/// step's. With the bf16 mixer a pass's prompt rows leave the mixer in bf16 and its decode rows
/// in f32, widened to one dtype before the output head.
pub fn mixed_differences(m: &CausalLm, seed: u64, algo: PrefillAlgo) -> Vec<usize> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let v = m.config().common.vocab_size;
    let (prompt, next) = (tokens(&mut rng, v, 37), tokens(&mut rng, v, STEPS));
    let others: Vec<Vec<u32>> = (0..3).map(|i| tokens(&mut rng, v, 20 + 45 * i)).collect();
    let got = in_mixed(m, &prompt, &next, &others, algo);
    got.iter().zip(alone(m, &prompt, &next, algo)).map(|(g, s)| differing(g, &s)).collect()
}

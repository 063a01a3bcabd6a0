//! Prefix-cache exactness: a prompt continued from a snapshot of a shared prefix against the
//! same prompt prefilled whole, for the CPU test (`prefix_cache.rs`) and the GPU's (`gpu.rs`).

use deltaserve_engine::state::PoolSize;
use deltaserve_engine::{CausalLm, Logits, PrefillAlgo, SnapshotAt, StatePool, PREFILL_CHUNK};
use rand::SeedableRng;

use crate::invariance::tokens;
use crate::values;

/// Decode steps compared after the prompt.
const STEPS: u32 = 3;

/// The logits after `prompt` and after each of 3 decode steps, `prompt[..from]` coming from
/// the pool's state in `slot` already.
fn run(
    m: &CausalLm,
    pool: &mut StatePool,
    slot: deltaserve_engine::SlotId,
    prompt: &[u32],
    from: usize,
    algo: PrefillAlgo,
) -> Vec<Vec<f32>> {
    let mut out = vec![values(&m.prefill(pool, slot, &prompt[from..], Logits::Last, algo).unwrap())];
    let v = m.config().common.vocab_size as u32;
    for step in 0..STEPS {
        out.push(values(&m.decode(pool, &[(slot, (prompt.len() as u32 + step * 7) % v)]).unwrap()));
    }
    out
}

/// One case: its name, the logits with the cache and without it.
pub type Case = (String, Vec<Vec<f32>>, Vec<Vec<f32>>);

/// A 200-token prompt is prefilled with snapshots at 64, 128 and 192 taken inside the pass
/// (a mixed pass with `beside_decode`: the pass also decodes another running sequence, as the
/// server's passes do); then prompts sharing its first 127, 128, 129 and 200 tokens (ending
/// there, or going on 20 tokens) continue from their longest snapshot of at most `len − 1`
/// tokens, as the server does, and are compared with the same prompts prefilled whole in a
/// fresh pool, all at `algo`.
pub fn cached_against_whole(m: &CausalLm, seed: u64, algo: PrefillAlgo, beside_decode: bool) -> Vec<Case> {
    let v = m.config().common.vocab_size;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let shared = tokens(&mut rng, v, 200);
    let more = tokens(&mut rng, v, 20);
    let size = PoolSize { slots: 3, snapshots: 3, kv_blocks: 96, block_size: 16, max_seq_len: 512 };
    let mut pool = m.new_pool_sized(size).unwrap();
    let first = pool.allocate().unwrap();
    let snaps: Vec<SnapshotAt> =
        (1..=3).map(|k| SnapshotAt { seq: 0, tokens: k * PREFILL_CHUNK, snap: pool.take_snapshot().unwrap() }).collect();
    if beside_decode {
        let running = pool.allocate().unwrap();
        m.prefill(&mut pool, running, &more, Logits::Last, algo).unwrap();
        m.prefill_and_decode(&mut pool, &[(first, &shared)], algo, &snaps, &[(running, 7 % v as u32)]).unwrap();
        pool.release(running).unwrap();
    } else {
        m.prefill_many_with(&mut pool, &[(first, &shared)], algo, &snaps).unwrap();
    }
    pool.release(first).unwrap();
    let mut cases = Vec::new();
    for k in [127, 128, 129, 200] {
        for tail in [0, more.len()] {
            let prompt = [&shared[..k], &more[..tail]].concat();
            let Some(snap) = snaps.iter().rev().find(|s| s.tokens < prompt.len() && s.tokens <= k) else { continue };
            let slot = pool.allocate().unwrap();
            assert!(pool.restore(snap.snap, slot).unwrap());
            let cached = run(m, &mut pool, slot, &prompt, snap.tokens, algo);
            pool.release(slot).unwrap();
            let mut fresh = m.new_pool_sized(PoolSize { snapshots: 0, ..size }).unwrap();
            let s = fresh.allocate().unwrap();
            let whole = run(m, &mut fresh, s, &prompt, 0, algo);
            cases.push((format!("{} tokens from the snapshot at {}", prompt.len(), snap.tokens), cached, whole));
        }
    }
    cases
}

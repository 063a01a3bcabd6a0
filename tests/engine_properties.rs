//! Properties of prefill and decode on random inputs and random model shapes:
//! chunked prefill equals the recurrence, prefill splits anywhere, prefill + decode equals the
//! full forward, batched decode equals decoding alone, and a reused slot equals a fresh one.

use candle_core::{DType, Device};
use deltaserve_engine::synth::write_random_checkpoint;
use deltaserve_engine::weights::Checkpoint;
use deltaserve_engine::{CausalLm, Logits, PrefillAlgo};
use deltaserve_tests::{compact_dir, last_row_vs_whole_pass, packed_model_prefill_error, rel_err, values};
use rand::{Rng, SeedableRng};
use serde_json::json;

const TOL: f64 = 1e-4;

/// The committed fixtures plus random shapes: GVA, no conv, sigmoid gate, tied, n_h = 3,
/// no forget gate, conv width 2, odd head dims.
fn models() -> Vec<(String, CausalLm, tempfile::TempDir)> {
    let mut out = Vec::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let configs = [
        json!({"model_type":"gated_deltanet","hidden_size":48,"num_hidden_layers":2,"num_heads":2,"num_v_heads":4,"head_dim":12,"expand_v":1.5,"vocab_size":97,"intermediate_size":80,"output_gate_activation":"sigmoid","tie_word_embeddings":true}),
        json!({"model_type":"gated_deltanet","hidden_size":40,"num_hidden_layers":2,"num_heads":1,"head_dim":20,"expand_v":1.0,"vocab_size":61,"use_short_conv":false,"use_gate":false,"allow_neg_eigval":true,"conv_size":2}),
        json!({"model_type":"gated_deltaproduct","hidden_size":32,"num_hidden_layers":2,"num_heads":2,"head_dim":8,"expand_v":2.0,"vocab_size":53,"num_householder":3,"use_forget_gate":true,"allow_neg_eigval":true,"conv_size":3}),
        json!({"model_type":"gated_deltaproduct","hidden_size":32,"num_hidden_layers":1,"num_heads":2,"head_dim":16,"expand_v":0.5,"vocab_size":50,"num_householder":2,"use_forget_gate":false,"use_output_gate":false}),
        json!({"model_type":"delta_net","hidden_size":32,"num_hidden_layers":2,"num_heads":2,"expand_k":0.5,"expand_v":1.5,"vocab_size":59,"use_gate":true,"use_short_conv":false}),
        json!({"model_type":"delta_net","hidden_size":24,"num_hidden_layers":2,"num_heads":3,"expand_k":1.0,"expand_v":2.0,"vocab_size":47,"use_beta":false,"allow_neg_eigval":true,"qk_activation":"elu","qk_norm":"sum","conv_size":3}),
    ];
    for (i, cfg) in configs.iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let c = write_random_checkpoint(cfg, dir.path(), DType::F32, rng.random(), None).unwrap();
        let m = CausalLm::load(&c, &Checkpoint::open(dir.path()).unwrap(), DType::F32, &Device::Cpu, true).unwrap();
        out.push((format!("random{i}:{}", c.model_type()), m, dir));
    }
    for name in deltaserve_tests::COMPACT_MODELS {
        let dir = compact_dir().join(name);
        let c = deltaserve_engine::read_config(&dir).unwrap();
        let m = CausalLm::load(&c, &Checkpoint::open(&dir).unwrap(), DType::F32, &Device::Cpu, false).unwrap();
        out.push((format!("compact/{name}"), m, tempfile::tempdir().unwrap()));
    }
    out
}

fn random_tokens(rng: &mut impl Rng, vocab: usize, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
}

fn vocab(m: &CausalLm) -> usize {
    m.config().common.vocab_size
}

#[test]
fn chunked_prefill_equals_token_by_token_recurrence() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for (name, m, _d) in models() {
        let toks = random_tokens(&mut rng, vocab(&m), 150);
        let mut pool = m.new_pool(3).unwrap();
        let (a, b, c) = (pool.allocate().unwrap(), pool.allocate().unwrap(), pool.allocate().unwrap());
        let chunked = values(&m.prefill(&mut pool, a, &toks, Logits::All, PrefillAlgo::Chunked).unwrap());
        let recurrent = values(&m.prefill(&mut pool, b, &toks, Logits::All, PrefillAlgo::Recurrent).unwrap());
        let e = rel_err(&chunked, &recurrent);
        assert!(e < TOL, "{name}: chunked vs recurrent prefill {e:.3e}");
        // Token by token through the decode path.
        let v = vocab(&m);
        let mut stepped = values(&m.prefill(&mut pool, c, &toks[..1], Logits::All, PrefillAlgo::Chunked).unwrap());
        for &t in &toks[1..] {
            stepped.extend(values(&m.decode(&mut pool, &[(c, t)]).unwrap()));
        }
        let e = rel_err(&stepped, &chunked);
        assert!(e < TOL, "{name}: decode steps vs chunked prefill {e:.3e}");
        assert_eq!(stepped.len(), toks.len() * v);
    }
}

#[test]
fn split_prefill_equals_whole_prefill_around_chunk_boundaries() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    for (name, m, _d) in models() {
        let toks = random_tokens(&mut rng, vocab(&m), 270);
        let mut pool = m.new_pool(2).unwrap();
        let whole = pool.allocate().unwrap();
        let full = values(&m.prefill(&mut pool, whole, &toks, Logits::All, PrefillAlgo::Chunked).unwrap());
        let after_whole = values(&m.decode(&mut pool, &[(whole, 5)]).unwrap());
        for split in [1usize, 63, 64, 65, 200] {
            let s = pool.allocate().unwrap();
            let first = values(&m.prefill(&mut pool, s, &toks[..split], Logits::All, PrefillAlgo::Chunked).unwrap());
            let second = values(&m.prefill(&mut pool, s, &toks[split..], Logits::All, PrefillAlgo::Chunked).unwrap());
            let joined: Vec<f32> = first.into_iter().chain(second).collect();
            let e = rel_err(&joined, &full);
            assert!(e < TOL, "{name}: split at {split}: logits {e:.3e}");
            // The states match too: the next decode step agrees.
            let next = values(&m.decode(&mut pool, &[(s, 5)]).unwrap());
            let e = rel_err(&next, &after_whole);
            assert!(e < TOL, "{name}: split at {split}: state {e:.3e}");
            pool.release(s).unwrap();
        }
    }
}

#[test]
fn batched_decode_equals_each_slot_alone_in_any_order() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for (name, m, _d) in models() {
        let v = vocab(&m);
        let prompts: Vec<Vec<u32>> = [5usize, 64, 1, 90].iter().map(|&n| random_tokens(&mut rng, v, n)).collect();
        let next: Vec<u32> = random_tokens(&mut rng, v, prompts.len());
        // Alone.
        let mut alone = Vec::new();
        for (p, &t) in prompts.iter().zip(&next) {
            let mut pool = m.new_pool(1).unwrap();
            let s = pool.allocate().unwrap();
            m.prefill(&mut pool, s, p, Logits::Last, PrefillAlgo::Chunked).unwrap();
            alone.push(values(&m.decode(&mut pool, &[(s, t)]).unwrap()));
        }
        // Together, in a shuffled slot order, in a pool with extra slots.
        let mut pool = m.new_pool(6).unwrap();
        let _spare = pool.allocate().unwrap();
        let slots: Vec<_> = prompts.iter().map(|_| pool.allocate().unwrap()).collect();
        for (p, &s) in prompts.iter().zip(&slots) {
            m.prefill(&mut pool, s, p, Logits::Last, PrefillAlgo::Chunked).unwrap();
        }
        let order = [2usize, 0, 3, 1];
        let batch: Vec<_> = order.iter().map(|&i| (slots[i], next[i])).collect();
        let together = values(&m.decode(&mut pool, &batch).unwrap());
        for (row, &i) in order.iter().enumerate() {
            let e = rel_err(&together[row * v..(row + 1) * v], &alone[i]);
            assert!(e < 1e-5, "{name}: sequence {i} in batch row {row}: {e:.3e}");
        }
    }
}

#[test]
fn reused_slot_behaves_like_a_fresh_one() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    for (name, m, _d) in models() {
        let v = vocab(&m);
        let (p1, p2) = (random_tokens(&mut rng, v, 77), random_tokens(&mut rng, v, 9));
        let mut fresh_pool = m.new_pool(1).unwrap();
        let f = fresh_pool.allocate().unwrap();
        let fresh = values(&m.prefill(&mut fresh_pool, f, &p2, Logits::All, PrefillAlgo::Chunked).unwrap());

        let mut pool = m.new_pool(1).unwrap();
        let s = pool.allocate().unwrap();
        m.prefill(&mut pool, s, &p1, Logits::Last, PrefillAlgo::Chunked).unwrap();
        m.decode(&mut pool, &[(s, 3)]).unwrap();
        pool.release(s).unwrap();
        let s2 = pool.allocate().unwrap();
        assert_eq!(s, s2, "the single slot is reused");
        let reused = values(&m.prefill(&mut pool, s2, &p2, Logits::All, PrefillAlgo::Chunked).unwrap());
        assert_eq!(reused, fresh, "{name}: reused slot leaked state");
    }
}

#[test]
fn forked_slot_continues_like_the_original() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for (name, m, _d) in models() {
        let p = random_tokens(&mut rng, vocab(&m), 40);
        let mut pool = m.new_pool(2).unwrap();
        let a = pool.allocate().unwrap();
        m.prefill(&mut pool, a, &p, Logits::Last, PrefillAlgo::Chunked).unwrap();
        let b = pool.fork(a).unwrap().unwrap();
        let la = values(&m.decode(&mut pool, &[(a, 7)]).unwrap());
        let lb = values(&m.decode(&mut pool, &[(b, 7)]).unwrap());
        assert_eq!(la, lb, "{name}: fork differs");
        assert!(pool.fork(a).unwrap().is_none(), "pool of 2 is full");
    }
}

#[test]
fn bad_tokens_and_slots_are_errors_not_panics() {
    let (_, m, _d) = models().remove(0);
    let mut pool = m.new_pool(1).unwrap();
    let s = pool.allocate().unwrap();
    let e = m.prefill(&mut pool, s, &[1, 100_000], Logits::Last, PrefillAlgo::Chunked).unwrap_err().to_string();
    assert!(e.contains("token id") && e.contains("100000"), "{e}");
    let e = m.prefill(&mut pool, s, &[], Logits::Last, PrefillAlgo::Chunked).unwrap_err().to_string();
    assert!(e.contains("`tokens`"), "{e}");
    pool.release(s).unwrap();
    let e = m.decode(&mut pool, &[(s, 1)]).unwrap_err().to_string();
    assert!(e.contains("`slot`"), "{e}");
    assert!(pool.release(s).is_err(), "double release is refused");
}

#[test]
fn packed_prefill_of_several_sequences_equals_prefilling_each_alone() {
    for (name, m, _dir) in models() {
        let e = packed_model_prefill_error(&m, 17);
        println!("{name}: packed vs alone (logits, decode, states) worst rel err {e:.2e}");
        assert!(e <= 1e-5, "{name}: {e:.3e}");
    }
}

/// A pass that returns only the last row's logits runs its last block's output head and
/// channel mixer for that row alone: the logits equal the whole pass's last row, and every row
/// still updates the caches (the next decode step's logits are the same bits).
#[test]
fn last_row_logits_equal_the_whole_pass_last_row() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for (name, m, _d) in models() {
        let toks = random_tokens(&mut rng, vocab(&m), 150);
        let (e, same_caches) = last_row_vs_whole_pass(&m, &toks, PrefillAlgo::Chunked);
        assert!(e <= 1e-5, "{name}: last row {e:.3e}");
        assert!(same_caches, "{name}: the caches after the two passes differ");
    }
}

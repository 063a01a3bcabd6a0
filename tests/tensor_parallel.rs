//! Tensor parallelism's sharding math on the CPU: a model split over N ranks (threads of one
//! process, each with its own slice of every layer and its own state pool, the partial sums
//! added by `ThreadGroup`'s all-reduce) gives the unsplit model's logits through chunked
//! prefills, a packed prefill and decode steps; every rank returns the same logits; each rank's
//! recurrent states are 1/N of the model's.

use std::path::Path;

use candle_core::{DType, Device};
use deltaserve_engine::tensor_parallel::{ExpertSplit, GroupLink, Shard, ThreadGroup};
use deltaserve_engine::{CacheSpec, CausalLm, Engine, LoadOptions, Logits, PrefillAlgo};
use deltaserve_tests::{compact_dir, compact_model, rel_err, serving_script, values};
use rand::{Rng, SeedableRng};

/// The same work on any model: three prompts (one alone over two prefill chunks, two packed),
/// then four decode steps of all three with fixed tokens. Every logit produced, in order.
fn script(m: &CausalLm, seed: u64) -> deltaserve_engine::Result<Vec<Vec<f32>>> {
    let vocab = m.config().common.vocab_size as u32;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut toks = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..vocab)).collect() };
    let (a, b, c) = (toks(100), toks(5), toks(70));
    let steps: Vec<Vec<u32>> = (0..4).map(|_| toks(3)).collect();
    let mut pool = m.new_pool(3)?;
    let slots: Vec<_> = (0..3).filter_map(|_| pool.allocate()).collect();
    let mut out = vec![values(&m.prefill(&mut pool, slots[0], &a, Logits::All, PrefillAlgo::Chunked)?)];
    out.push(values(&m.prefill_many(&mut pool, &[(slots[1], &b), (slots[2], &c)], PrefillAlgo::Chunked)?));
    for step in &steps {
        let batch: Vec<_> = slots.iter().copied().zip(step.iter().copied()).collect();
        out.push(values(&m.decode(&mut pool, &batch)?));
    }
    Ok(out)
}

/// Runs `script` on `n` ranks of `m` at once (MoE layers split by whole experts when `ep`,
/// else by channels); returns each rank's logits.
fn split_run(m: &CausalLm, n: usize, ep: bool, seed: u64) -> Vec<Vec<Vec<f32>>> {
    let group = ThreadGroup::new(n);
    let split = if ep { ExpertSplit::Experts } else { ExpertSplit::Channels };
    let shard = |r| Shard::new(r, n).unwrap().with_experts(split);
    let ranks: Vec<CausalLm> = (0..n).map(|r| m.shard(&GroupLink { shard: shard(r), group: group.clone() }).unwrap()).collect();
    if let Some(all) = m.experts_held() {
        for (r, rank) in ranks.iter().enumerate() {
            let per = if ep { all.len() / n } else { all.len() };
            let first = if ep { r * per } else { 0 };
            assert_eq!(rank.experts_held(), Some(first..first + per), "rank {r} of {n} (expert parallel: {ep})");
        }
    }
    // Each rank holds 1/N of every layer's recurrent states (its conv states may hold copies of
    // shared key heads' channels).
    let states = |specs: Vec<CacheSpec>| -> (usize, usize) {
        specs.iter().fold((0, 0), |(c, r), s| match s {
            CacheSpec::Recurrent { conv_state, recurrent_state, .. } => (c + conv_state, r + recurrent_state),
            _ => (c, r),
        })
    };
    let (conv, recurrent) = states(m.cache_specs());
    for r in &ranks {
        let (c, s) = states(r.cache_specs());
        assert_eq!(s * n, recurrent, "rank recurrent states are not 1/{n} of the model's");
        assert!(c * n >= conv && c < conv, "rank conv states: {c} of {conv}");
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks.iter().map(|r| s.spawn(move || script(r, seed).unwrap())).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Splits `m` over each of `sizes` and compares every rank with the unsplit model.
fn check(name: &str, m: &CausalLm, sizes: &[usize]) {
    check_split(name, m, sizes, false)
}

/// [`check`], MoE layers split by whole experts when `ep`.
fn check_split(name: &str, m: &CausalLm, sizes: &[usize], ep: bool) {
    let whole = script(m, 7).unwrap();
    for &n in sizes {
        let ranks = split_run(m, n, ep, 7);
        for (r, got) in ranks.iter().enumerate() {
            assert_eq!(got, &ranks[0], "{name} N={n}: rank {r}'s logits differ from rank 0's");
        }
        let mut worst: f64 = 0.0;
        for (i, (g, w)) in ranks[0].iter().zip(&whole).enumerate() {
            let e = rel_err(g, w);
            worst = worst.max(e);
            assert!(e <= 1e-5, "{name} N={n}: call {i}: logits rel err {e:.3e} against the unsplit model");
            // Greedy tokens agree wherever the unsplit model's margin is real.
            let vocab = m.config().common.vocab_size;
            for (row, (gr, wr)) in g.chunks(vocab).zip(w.chunks(vocab)).enumerate() {
                let mut sorted = wr.to_vec();
                sorted.sort_by(|a, b| b.total_cmp(a));
                let argmax = |v: &[f32]| v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|x| x.0);
                if sorted[0] - sorted[1] >= 1e-3 {
                    assert_eq!(argmax(gr), argmax(wr), "{name} N={n}: call {i} row {row}: greedy token differs");
                }
            }
        }
        println!("{name}: N={n}: every rank equal; worst rel err against the unsplit model {worst:.2e}");
    }
}

#[test]
fn split_hybrid_and_moe_models_equal_the_unsplit_model() {
    // fla's attention hybrid (a windowed GQA layer with qkv biases, a full MHA layer), Qwen3.5
    // (gated attention, zero-centred norms), Qwen3-Next and Qwen3.5-MoE (routed experts cut per
    // expert, the gated shared expert): 2 and 4 ranks (at 4 key and KV heads are shared).
    for name in ["gdn-attn", "qwen3_5", "qwen3_next", "qwen3_5_moe"] {
        check(name, &compact_model(name, DType::F32, &Device::Cpu), &[2, 4]);
    }
}

#[test]
fn moe_models_split_by_whole_experts_equal_the_unsplit_model() {
    // Expert parallelism: each rank holds E/N whole experts (the shared expert still cut) and
    // adds only the choices it holds; the all-reduce sums them. 8 experts: 2 and 4 ranks.
    for name in ["qwen3_next", "qwen3_5_moe"] {
        check_split(name, &compact_model(name, DType::F32, &Device::Cpu), &[2, 4], true);
    }
}

#[test]
fn split_gated_deltaproduct_equals_the_unsplit_model() {
    check("gdp", &compact_model("gdp", DType::F32, &Device::Cpu), &[2]);
    // Four heads, three householder steps: each step's block of k, v and b rows is cut alike.
    let dir = tempfile::tempdir().unwrap();
    let cfg = serde_json::json!({
        "model_type": "gated_deltaproduct", "architectures": ["GatedDeltaProductForCausalLM"],
        "hidden_size": 128, "num_hidden_layers": 2, "num_heads": 4, "head_dim": 16, "expand_v": 2, "num_householder": 3,
        "allow_neg_eigval": true, "use_forget_gate": true, "use_output_gate": true, "vocab_size": 256,
        "intermediate_size": 256, "conv_size": 4, "use_short_conv": true, "norm_eps": 1e-6, "tie_word_embeddings": false
    });
    deltaserve_engine::synth::write_random_checkpoint(&cfg, dir.path(), DType::F32, 5, None).unwrap();
    check("random gdp H=4 n=3", &load(dir.path()), &[2, 4]);
}

#[test]
fn split_gated_deltanet_models_equal_the_unsplit_model() {
    check("gdn", &compact_model("gdn", DType::F32, &Device::Cpu), &[2]);
    // One key head read by two value heads: at N=2 both ranks carry a copy of it.
    check("gdn-gva", &compact_model("gdn-gva", DType::F32, &Device::Cpu), &[2]);
    // More heads: 4 key heads, 8 value heads, split 2, 4 and 8 ways (at 8 key heads are shared).
    let dir = tempfile::tempdir().unwrap();
    let cfg = serde_json::json!({
        "model_type": "gated_deltanet", "architectures": ["GatedDeltaNetForCausalLM"],
        "hidden_size": 128, "num_hidden_layers": 2, "num_heads": 4, "num_v_heads": 8, "head_dim": 16, "expand_v": 1,
        "vocab_size": 256, "intermediate_size": 256, "conv_size": 4, "use_gate": true, "use_short_conv": true,
        "norm_eps": 1e-6, "fuse_norm": true, "tie_word_embeddings": false
    });
    deltaserve_engine::synth::write_random_checkpoint(&cfg, dir.path(), DType::F32, 3, None).unwrap();
    check("random gdn H=4 HV=8", &load(dir.path()), &[2, 4, 8]);
}

#[test]
fn splits_that_cannot_be_made_are_refused_with_the_reason() {
    let group = ThreadGroup::new(4);
    let link = |r| GroupLink { shard: Shard::new(r, 4).unwrap(), group: group.clone() };
    // Two value heads do not split four ways.
    let err = compact_model("gdn", DType::F32, &Device::Cpu).shard(&link(0)).unwrap_err().to_string();
    assert!(err.contains("num_v_heads") && err.contains("multiple of the tensor parallel size 4") && err.contains("got 2"), "{err}");
    let group2 = ThreadGroup::new(2);
    let link2 = GroupLink { shard: Shard::new(1, 2).unwrap(), group: group2 };
    for (name, what) in [("delta_net", "a DeltaNet layer"), ("olmo_hybrid", "a q/k RMSNorm over all heads at once")] {
        let err = compact_model(name, DType::F32, &Device::Cpu).shard(&link2).unwrap_err().to_string();
        assert!(err.contains("tensor parallel") && err.contains(what), "{name}: {err}");
    }
    let err = Shard::new(2, 2).unwrap_err().to_string();
    assert!(err.contains("below the group size 2"), "{err}");
}

fn load(dir: &Path) -> CausalLm {
    let c = deltaserve_engine::read_config(dir).unwrap();
    let ckpt = deltaserve_engine::weights::Checkpoint::open(dir).unwrap();
    CausalLm::load(&c, &ckpt, DType::F32, &Device::Cpu, false).unwrap()
}

#[test]
fn engine_split_over_ranks_serves_the_unsplit_engines_logits() {
    // `Engine::load` with `tensor_parallel_size` 2: each rank's slices read by `load_ranks`
    // (one layer at a time, cut then copied to its device), every pass run on both ranks at
    // once (rank 1 on its own thread, on its replica of the pool), pool changes mirrored.
    // The MoE fixture by every expert's channels and by whole experts a rank (the default for
    // its 8 experts over 2 ranks).
    let (channels, auto) = (ExpertSplit::Channels, ExpertSplit::Auto);
    for (name, split) in
        [("gdn", auto), ("gdp", auto), ("gdn-attn", auto), ("qwen3_5", auto), ("qwen3_next", channels), ("qwen3_next", auto)]
    {
        let dir = compact_dir().join(name);
        let load = |n: usize| {
            Engine::load(&LoadOptions { tensor_parallel_size: n, expert_split: split, ..LoadOptions::cpu(dir.to_str().unwrap()) }).unwrap()
        };
        let engine = load(2);
        if name == "qwen3_next" {
            let held = if split == channels { 0..8 } else { 0..4 };
            assert_eq!(engine.model().experts_held(), Some(held), "{name} ({split:?}): the experts rank 0 holds");
        }
        let (whole, split) = (serving_script(&load(1)), serving_script(&engine));
        let mut worst: f64 = 0.0;
        for (i, (s, w)) in split.iter().zip(&whole).enumerate() {
            let e = rel_err(s, w);
            worst = worst.max(e);
            assert!(e <= 1e-5, "{name} ({split:?}): call {i}: split engine's logits rel err {e:.3e} against the unsplit engine");
        }
        println!("{name} ({split:?}): engine over 2 ranks: worst rel err {worst:.2e}");
    }
}

#[test]
fn a_split_engine_driven_from_two_threads_at_once_serves_each_the_unsplit_logits() {
    // Each caller's passes must reach every rank thread in the same order: otherwise one
    // caller's rank would meet the other's in an all-reduce (wrong sums, or a hang).
    let dir = compact_dir().join("gdn-attn");
    let load = |n: usize| Engine::load(&LoadOptions { tensor_parallel_size: n, ..LoadOptions::cpu(dir.to_str().unwrap()) }).unwrap();
    let whole = serving_script(&load(1));
    let split = load(2);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| serving_script(&split));
        let b = s.spawn(|| serving_script(&split));
        (a.join().unwrap(), b.join().unwrap())
    });
    for (who, run) in [("first", a), ("second", b)] {
        for (i, (s, w)) in run.iter().zip(&whole).enumerate() {
            let e = rel_err(s, w);
            assert!(e <= 1e-5, "{who} caller: call {i}: rel err {e:.3e} against the unsplit engine");
        }
    }
}

#[test]
fn an_engine_split_where_it_cannot_be_is_refused_at_load() {
    let dir = compact_dir().join("gdn");
    let err = Engine::load(&LoadOptions { tensor_parallel_size: 4, ..LoadOptions::cpu(dir.to_str().unwrap()) }).unwrap_err().to_string();
    assert!(err.contains("num_v_heads") && err.contains("multiple of the tensor parallel size 4"), "{err}");
    let err = Engine::load(&LoadOptions { tensor_parallel_size: 0, ..LoadOptions::cpu(dir.to_str().unwrap()) }).unwrap_err().to_string();
    assert!(err.contains("tensor_parallel_size") && err.contains("at least 1"), "{err}");
}

//! Short prefill passes and mixed passes replayed from CUDA graphs (padded to a row bucket, the
//! padding a sequence of its own in a lent slot; a mixed pass's decode rows padded to a bucket,
//! each padding row in a lent slot) leave the same logits, states and snapshots as the eager
//! pass, within the tolerance of GEMMs run at another row count; and they touch no other slot.
//! Hybrids and MoE models take part: the next decode step of every sequence reads the KV cache
//! the pass wrote, and the padding's KV blocks go back to the pool.

use candle_core::{DType, Device};
use deltaserve_engine::prefill_graph::Shape;
use deltaserve_engine::state::PoolSize;
use deltaserve_engine::{Engine, LoadOptions, SnapshotAt, StatePool};
use deltaserve_tests::{model_fixtures, rel_err, values};

/// Prompt lengths of one pass, and snapshots (sequence, tokens) taken in it.
type Case = (&'static [usize], &'static [(usize, usize)]);

const CASES: &[Case] = &[
    (&[1], &[]),
    (&[51], &[]),
    (&[63], &[]),
    (&[64], &[(0, 64)]),
    (&[65], &[]),
    (&[100], &[(0, 64)]),
    (&[128], &[(0, 64), (0, 128)]),
    (&[200], &[(0, 192)]),
    (&[256], &[]),
    (&[30, 40], &[]),
    (&[64, 64], &[(1, 64)]),
    (&[10, 20, 30, 5, 7, 9, 11, 13], &[]),
];

fn load(dir: &str, dtype: DType, dev: &Device, graph_tokens: usize) -> Engine {
    load_mixed(dir, dtype, dev, graph_tokens, 0)
}

fn load_mixed(dir: &str, dtype: DType, dev: &Device, graph_tokens: usize, mixed_tokens: usize) -> Engine {
    let algo = if dtype == DType::F32 { deltaserve_engine::PrefillAlgo::Chunked } else { deltaserve_engine::PrefillAlgo::ChunkedBf16 };
    let opts = LoadOptions {
        dtype,
        device: dev.clone(),
        prefill_algo: algo,
        prefill_graph_tokens: graph_tokens,
        mixed_graph_tokens: mixed_tokens,
        ..LoadOptions::cpu(dir)
    };
    Engine::load(&opts).unwrap()
}

/// The models the graph tests run: the compact fixtures, and random fla hybrids whose bf16
/// attention takes the GPU prefill's tile kernels (the fixtures' head dims, 16 to 32, take the
/// row kernel): attention at head dim 128 with two query heads a KV head (the warpgroup kernel),
/// and two windowed attention layers at head dim 64 (the mma.sync tiles), each beside Gated
/// DeltaNet layers. The directories live as long as the second value.
fn graph_models(test: &str) -> (Vec<(String, std::path::PathBuf)>, Vec<tempfile::TempDir>) {
    let mut models: Vec<(String, std::path::PathBuf)> = model_fixtures(test).into_iter().map(|(n, d, _, _)| (n, d)).collect();
    let hybrid = |hidden: usize, attn: serde_json::Value| {
        serde_json::json!({
            "model_type": "gated_deltanet", "architectures": ["GatedDeltaNetForCausalLM"], "hidden_size": hidden,
            "num_hidden_layers": 3, "vocab_size": 512, "hidden_ratio": 2, "conv_size": 4, "use_gate": true,
            "use_short_conv": true, "norm_eps": 1e-6, "fuse_norm": true, "tie_word_embeddings": false, "num_heads": 2,
            "head_dim": 64, "expand_v": 2, "attn": attn
        })
    };
    let wide = hybrid(512, serde_json::json!({"layers": [1], "num_heads": 4, "num_kv_heads": 2, "qkv_bias": true, "rope_theta": 10000.0}));
    let windowed =
        hybrid(256, serde_json::json!({"layers": [1, 2], "num_heads": 4, "num_kv_heads": 2, "window_size": 40, "rope_theta": 10000.0}));
    let mut dirs = Vec::new();
    for (name, cfg) in [("random/gdn-attn-hd128", wide), ("random/gdn-window-hd64", windowed)] {
        let dir = tempfile::tempdir().unwrap();
        // The compact GDN fixture's tokenizer: 512 tokens, as the config.
        let tokenizer = deltaserve_tests::compact_dir().join("gdn");
        deltaserve_engine::synth::write_random_checkpoint(&cfg, dir.path(), DType::BF16, 11, Some(&tokenizer)).unwrap();
        models.push((name.to_string(), dir.path().to_path_buf()));
        dirs.push(dir);
    }
    (models, dirs)
}

/// Every recurrent layer's state (recurrent, then conv) of `slot`, concatenated.
fn states(pool: &StatePool, slot: usize) -> Vec<f32> {
    let mut v = Vec::new();
    for l in 0..pool.num_layers() {
        if let Some(s) = pool.layer(l).recurrent() {
            v.extend(s.recurrent_state.slot_to_vec(slot).unwrap());
            v.extend(s.conv_state.slot_to_vec(slot).unwrap());
        }
    }
    v
}

pub fn gpu_prefill_graphs_equal_eager_prefill(dev: &Device) {
    let mut graphed = 0;
    let (models, _dirs) = graph_models("gpu_prefill_graphs_equal_eager_prefill");
    for (name, dir) in &models {
        for (dtype, tol) in [(DType::F32, 1e-4), (DType::BF16, 2e-2)] {
            let wg_launches = deltaserve_kernels::ops::attention_warpgroup_launches();
            let (g, e) = (load(dir.to_str().unwrap(), dtype, dev, 256), load(dir.to_str().unwrap(), dtype, dev, 0));
            let cfg = g.config();
            assert!(!g.prefill_graph_buckets().is_empty(), "{name}: prefill graphs on for every model");
            assert!(e.prefill_graph_buckets().is_empty(), "{name}: 0 tokens turns them off");
            assert_eq!(g.prefill_graph_buckets(), vec![64, 128, 256]);
            let size = PoolSize { snapshots: 4, ..PoolSize::for_tokens(12, 1024) };
            let (mut pg, mut pe) = (g.new_pool_sized(size).unwrap(), e.new_pool_sized(size).unwrap());
            let vocab = cfg.common.vocab_size as u32;
            let toks = |n: usize, seed: u32| -> Vec<u32> { (0..n as u32).map(|i| (i * 7919 + seed * 104_729 + 13) % vocab).collect() };
            // A bystander sequence in both pools, which no pass may touch.
            let (bg, be) = (pg.allocate().unwrap(), pe.allocate().unwrap());
            let head = toks(70, 99);
            g.prefill_many(&mut pg, &[(bg, &head)]).unwrap();
            e.prefill_many(&mut pe, &[(be, &head)]).unwrap();
            let bystander = states(&pg, bg.index());
            let mut worst = 0f64;
            for (case, &(lens, snaps)) in CASES.iter().enumerate() {
                // Three rounds: from fixed tables eagerly, captured (the first replay), replayed.
                for round in 0..3 {
                    let seed = (case * 3 + round) as u32;
                    let prompts: Vec<Vec<u32>> = lens.iter().enumerate().map(|(i, &n)| toks(n, seed * 10 + i as u32)).collect();
                    let run = |eng: &Engine, pool: &mut StatePool| {
                        let slots: Vec<_> = prompts.iter().map(|_| pool.allocate().unwrap()).collect();
                        // The first sequence continues a 64-token prefill: a cached chat turn.
                        eng.prefill_many(pool, &[(slots[0], &toks(64, 1000 + seed))]).unwrap();
                        let at: Vec<SnapshotAt> =
                            snaps.iter().map(|&(seq, tokens)| SnapshotAt { seq, tokens, snap: pool.take_snapshot().unwrap() }).collect();
                        let batch: Vec<_> = slots.iter().zip(&prompts).map(|(s, p)| (*s, p.as_slice())).collect();
                        let logits = values(&eng.prefill_many(pool, &batch).unwrap());
                        let mut st: Vec<Vec<f32>> = slots.iter().map(|s| states(pool, s.index())).collect();
                        st.extend(at.iter().map(|a| states(pool, a.snap.index())));
                        let seen: Vec<usize> = slots.iter().map(|&s| pool.seen(s)).collect();
                        let blocks = pool.kv_blocks_used();
                        // Every sequence's next step reads the KV cache the pass wrote.
                        let step: Vec<_> = slots.iter().map(|&s| (s, 5u32 % vocab)).collect();
                        let next = values(&eng.decode(pool, &step).unwrap());
                        for a in at {
                            pool.drop_snapshot(a.snap).unwrap();
                        }
                        for s in slots {
                            pool.release(s).unwrap();
                        }
                        (logits, st, seen, blocks, next)
                    };
                    let (lg, sg, ng, bg_, dg) = run(&g, &mut pg);
                    let (le, se, ne, be_, de) = run(&e, &mut pe);
                    let what = format!("{name} {dtype:?} lens {lens:?} snapshots {snaps:?} round {round}");
                    assert_eq!(ng, ne, "{what}: tokens seen");
                    let expected: Vec<usize> = lens.iter().enumerate().map(|(i, n)| n + if i == 0 { 64 } else { 0 }).collect();
                    assert_eq!(ng, expected, "{what}: tokens seen");
                    assert_eq!(bg_, be_, "{what}: KV blocks held after the pass (the padding's returned)");
                    let el = rel_err(&lg, &le);
                    assert!(el <= tol, "{what}: logits rel err {el:.3e}");
                    worst = worst.max(el);
                    let ed = rel_err(&dg, &de);
                    assert!(ed <= tol, "{what}: the next decode step's logits rel err {ed:.3e}");
                    worst = worst.max(ed);
                    for (i, (a, b)) in sg.iter().zip(&se).enumerate() {
                        let es = rel_err(a, b);
                        assert!(es <= tol, "{what}: state {i} (sequences, then snapshots) rel err {es:.3e}");
                        worst = worst.max(es);
                    }
                    assert_eq!((pg.used(), pg.snapshots_used()), (1, 0), "{what}: the padding's slot is returned");
                }
                let rows = lens.iter().sum::<usize>().next_power_of_two().max(64);
                let shape = Shape { rows, seqs: lens.len(), decode: 0 };
                assert!(g.prefill_graph_shapes().contains(&shape), "{name} {dtype:?}: {shape:?} captured");
            }
            assert_eq!(states(&pg, bg.index()), bystander, "{name} {dtype:?}: the bystander's state, bit for bit");
            let (dg, de) = (values(&g.decode(&mut pg, &[(bg, 3)]).unwrap()), values(&e.decode(&mut pe, &[(be, 3)]).unwrap()));
            assert!(rel_err(&dg, &de) <= tol, "{name} {dtype:?}: the bystander decodes as in the eager engine");
            println!("  {name} {dtype:?}: {} cases × 3 rounds, worst rel err {worst:.2e}", CASES.len());
            if name.ends_with("hd128") && dtype == DType::BF16 {
                let n = deltaserve_kernels::ops::attention_warpgroup_launches() - wg_launches;
                assert!(n > 0, "{name}: the warpgroup attention kernel ran ({n} launches)");
            }
            graphed += 1;
        }
    }
    assert!(graphed >= 26, "every compact model (MoE too) and the random hybrids in f32 and bf16 ran through graphs ({graphed})");
}

/// A mixed pass's prompt pieces, its decode rows, and snapshots (sequence, tokens) in it.
type MixedCase = (&'static [usize], usize, &'static [(usize, usize)]);

const MIXED_CASES: &[MixedCase] = &[
    (&[1], 1, &[]),
    (&[100], 3, &[]),
    (&[128], 5, &[(0, 64), (0, 128)]),
    (&[64, 70], 9, &[(1, 64)]),
    (&[300], 17, &[]),
    (&[480], 19, &[(0, 448)]),
    (&[512], 16, &[]),
    (&[200, 30, 5], 12, &[]),
    (&[300, 290], 7, &[(1, 256)]),
    (&[90, 80, 85, 70, 88, 84, 91], 1, &[]),
];

/// Running sequences the mixed cases draw their decode rows from.
const RUNNING: usize = 19;

pub fn gpu_mixed_graphs_equal_eager_mixed_passes(dev: &Device) {
    use deltaserve_engine::prefill_graph::decode_bucket;
    let mut graphed = 0;
    let (models, _dirs) = graph_models("gpu_mixed_graphs_equal_eager_mixed_passes");
    for (name, dir) in &models {
        for (dtype, tol) in [(DType::F32, 1e-4), (DType::BF16, 2e-2)] {
            let dir = dir.to_str().unwrap();
            let (g, e) = (load_mixed(dir, dtype, dev, 0, 1024), load_mixed(dir, dtype, dev, 0, 0));
            assert!(!g.mixed_graph_buckets().is_empty(), "{name}: mixed graphs on for every model");
            assert_eq!(g.mixed_graph_buckets(), vec![64, 128, 256, 512, 640, 768, 896, 1024]);
            assert!(e.mixed_graph_buckets().is_empty(), "{name}: 0 tokens turns them off");
            let size = PoolSize { snapshots: 4, ..PoolSize::for_tokens(48, 2048) };
            let (mut pg, mut pe) = (g.new_pool_sized(size).unwrap(), e.new_pool_sized(size).unwrap());
            let vocab = g.config().common.vocab_size as u32;
            let toks = |n: usize, seed: u32| -> Vec<u32> { (0..n as u32).map(|i| (i * 7919 + seed * 104_729 + 13) % vocab).collect() };
            // The running sequences, and a bystander no pass may touch, in both pools.
            let mut running = Vec::new();
            for i in 0..=RUNNING {
                let (sg, se) = (pg.allocate().unwrap(), pe.allocate().unwrap());
                let head = toks(20 + 7 * i, 500 + i as u32);
                g.prefill_many(&mut pg, &[(sg, &head)]).unwrap();
                e.prefill_many(&mut pe, &[(se, &head)]).unwrap();
                running.push((sg, se));
            }
            let (bg, be) = running.pop().unwrap();
            let bystander = states(&pg, bg.index());
            let mut worst = 0f64;
            for (case, &(lens, decode, snaps)) in MIXED_CASES.iter().enumerate() {
                // Three rounds: from fixed tables eagerly, captured (the first replay), replayed;
                // each with other prompts and another choice and order of decode rows.
                for round in 0..3 {
                    let seed = (case * 3 + round) as u32;
                    let prompts: Vec<Vec<u32>> = lens.iter().enumerate().map(|(i, &n)| toks(n, seed * 10 + i as u32)).collect();
                    let rows: Vec<usize> = (0..decode)
                        .map(|j| (j * 7 + round * 5 + case) % RUNNING)
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    let rows: Vec<usize> = if rows.len() == decode { rows } else { (0..decode).map(|j| (j + round) % RUNNING).collect() };
                    let run = |eng: &Engine, pool: &mut StatePool, mine: &dyn Fn(usize) -> deltaserve_engine::SlotId| {
                        let slots: Vec<_> = prompts.iter().map(|_| pool.allocate().unwrap()).collect();
                        let at: Vec<SnapshotAt> =
                            snaps.iter().map(|&(seq, tokens)| SnapshotAt { seq, tokens, snap: pool.take_snapshot().unwrap() }).collect();
                        let batch: Vec<_> = slots.iter().zip(&prompts).map(|(s, p)| (*s, p.as_slice())).collect();
                        let step: Vec<_> = rows.iter().rev().map(|&r| (mine(r), (r as u32 * 37 + seed) % vocab)).collect();
                        let logits = values(&eng.prefill_and_decode(pool, &batch, &at, &step).unwrap());
                        let mut st: Vec<Vec<f32>> = slots.iter().map(|s| states(pool, s.index())).collect();
                        st.extend(at.iter().map(|a| states(pool, a.snap.index())));
                        st.extend(step.iter().map(|(s, _)| states(pool, s.index())));
                        let seen: Vec<usize> = slots.iter().chain(step.iter().map(|(s, _)| s)).map(|&s| pool.seen(s)).collect();
                        let blocks = pool.kv_blocks_used();
                        // The pieces' next step reads the KV cache the pass wrote.
                        let next: Vec<_> = slots.iter().map(|&s| (s, 5u32 % vocab)).collect();
                        let next = values(&eng.decode(pool, &next).unwrap());
                        for a in at {
                            pool.drop_snapshot(a.snap).unwrap();
                        }
                        for s in slots {
                            pool.release(s).unwrap();
                        }
                        (logits, st, seen, blocks, next)
                    };
                    let (lg, sg, ng, bg_, dg) = run(&g, &mut pg, &|r| running[r].0);
                    let (le, se, ne, be_, de) = run(&e, &mut pe, &|r| running[r].1);
                    let what = format!("{name} {dtype:?} lens {lens:?} decode {decode} snapshots {snaps:?} round {round}");
                    assert_eq!(ng, ne, "{what}: tokens seen");
                    assert_eq!(lg.len(), le.len(), "{what}: one row of logits per piece and decode row");
                    assert_eq!(bg_, be_, "{what}: KV blocks held after the pass (the padding's returned)");
                    let el = rel_err(&lg, &le);
                    assert!(el <= tol, "{what}: logits rel err {el:.3e}");
                    worst = worst.max(el);
                    let ed = rel_err(&dg, &de);
                    assert!(ed <= tol, "{what}: the pieces' next decode step's logits rel err {ed:.3e}");
                    worst = worst.max(ed);
                    for (i, (a, b)) in sg.iter().zip(&se).enumerate() {
                        let es = rel_err(a, b);
                        assert!(es <= tol, "{what}: state {i} (pieces, snapshots, decode rows) rel err {es:.3e}");
                        worst = worst.max(es);
                    }
                    assert_eq!((pg.used(), pg.snapshots_used()), (RUNNING + 1, 0), "{what}: the padding's slots are returned");
                }
                // 64, 128, 256, 512, then multiples of 128 (590 and 588 tokens: 640 rows).
                let tokens = lens.iter().sum::<usize>();
                let rows = if tokens <= 512 { tokens.next_power_of_two().max(64) } else { tokens.div_ceil(128) * 128 };
                let shape = Shape { rows, seqs: lens.len(), decode: decode_bucket(decode) };
                assert!(g.prefill_graph_shapes().contains(&shape), "{name} {dtype:?}: {shape:?} captured");
            }
            assert_eq!(states(&pg, bg.index()), bystander, "{name} {dtype:?}: the bystander's state, bit for bit");
            let (dg, de) = (values(&g.decode(&mut pg, &[(bg, 3)]).unwrap()), values(&e.decode(&mut pe, &[(be, 3)]).unwrap()));
            assert!(rel_err(&dg, &de) <= tol, "{name} {dtype:?}: the bystander decodes as in the eager engine");
            println!("  {name} {dtype:?}: {} mixed cases × 3 rounds, worst rel err {worst:.2e}", MIXED_CASES.len());
            graphed += 1;
        }
    }
    assert!(
        graphed >= 26,
        "every compact model (MoE too) and the random hybrids in f32 and bf16 ran mixed passes through graphs ({graphed})"
    );
}

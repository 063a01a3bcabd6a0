//! Whole-model tables: the random 1.39B Gated DeltaNet (prefill T=4096 and decode steps against
//! the decode roofline, or one of `passes`' tables on it) and a saved hybrid checkpoint
//! (`--hybrid-dir`: prefill, graph decode, optional profiler ranges).

use std::time::Instant;

use candle_core::{DType, Device};
use deltaserve_engine::{CausalLm, Logits, PrefillAlgo};

use super::{copy_bw, median_ms, passes, Args};

/// The whole 1.39B model: written once to `args.model_dir`, then the table `args` asks for.
pub(super) fn model_table(dev: &Device, args: &Args) -> anyhow::Result<()> {
    let dir = &args.model_dir;
    if !dir.join("model.safetensors").exists() {
        let cfg = serde_json::json!({
            "model_type": "gated_deltanet", "architectures": ["GatedDeltaNetForCausalLM"],
            "hidden_size": 2048, "num_hidden_layers": 21, "num_heads": 6, "head_dim": 256, "expand_v": 2,
            "vocab_size": 32000, "hidden_ratio": 4, "conv_size": 4, "use_gate": true, "use_short_conv": true,
            "norm_eps": 1e-6, "fuse_norm": true, "tie_word_embeddings": false
        });
        let t0 = Instant::now();
        deltaserve_engine::synth::write_random_checkpoint(&cfg, dir, DType::BF16, 0, None)?;
        eprintln!("wrote {} in {:.1} s", dir.display(), t0.elapsed().as_secs_f64());
    }
    let cfg = deltaserve_engine::read_config(dir)?;
    let ckpt = deltaserve_engine::weights::Checkpoint::open(dir)?;
    let mut model = CausalLm::load(&cfg, &ckpt, DType::BF16, dev, false)?;
    model.set_state_dtype(deltaserve_engine::parse_dtype(&args.state_dtype)?)?;
    let params: usize = ckpt.names().iter().filter_map(|n| ckpt.shape(n)).map(|s| s.iter().product::<usize>()).sum();
    let weight_bytes = params as f64 * 2.0;
    // Conv states f32, recurrent states as `--state-dtype` keeps them.
    let state_bytes = model.cache_specs().iter().map(|s| s.bytes_per_sequence()).sum::<usize>() as f64;
    println!(
        "\n## Whole model: random Gated DeltaNet, {:.2} B params, bf16 (D=2048, 21 layers, H=6, K=256, expand_v=2)\n",
        params as f64 / 1e9
    );
    if args.small_prefill {
        return passes::small_prefill_table(&model, dev, args.reps);
    }
    #[cfg(feature = "cuda")]
    if args.host_cost {
        return passes::host_cost_table(&model, dev, args.reps);
    }
    #[cfg(feature = "cuda")]
    if args.prefill_graphs {
        return passes::prefill_graph_table(&model, dev, args.reps);
    }
    #[cfg(feature = "cuda")]
    if args.mixed_passes {
        return passes::mixed_pass_table(&model, dev, args.reps);
    }
    // Slots for the largest batch asked for (a batch the pool could not hold would be timed short).
    let mut pool = model.new_pool(args.batches.as_deref().and_then(|b| b.iter().max().copied()).unwrap_or(64).max(64))?;
    let t = 4096;
    let tokens: Vec<u32> = (0..t as u32).map(|i| (i * 7919 + 13) % cfg.common.vocab_size as u32).collect();
    #[cfg(feature = "cuda")]
    if let Some(b) = args.profile_decode {
        use candle_core::cuda_backend::cudarc::driver::{profiler_start, profiler_stop};
        let batch: Vec<_> = (0..b)
            .map(|i| pool.allocate().map(|s| (s, (i as u32 * 31 + 7) % 32000)))
            .collect::<Option<_>>()
            .ok_or_else(|| anyhow::anyhow!("pool of 64"))?;
        let mut graphs = deltaserve_engine::decode_graph::DecodeGraphs::default();
        // Eager, captured, replayed: the profiled step is a replay.
        for _ in 0..3 {
            graphs.decode_in_place(&model, &mut pool, &batch)?;
        }
        dev.synchronize()?;
        profiler_start()?;
        graphs.decode_in_place(&model, &mut pool, &batch)?;
        dev.synchronize()?;
        profiler_stop()?;
        return Ok(());
    }
    let slot = pool.allocate().ok_or_else(|| anyhow::anyhow!("empty pool"))?;
    #[cfg(feature = "cuda")]
    if args.profile_prefill {
        use candle_core::cuda_backend::cudarc::driver::{profiler_start, profiler_stop};
        let profiled = &tokens[..args.profile_tokens.clamp(1, t)];
        let algo = if args.profile_fp32 { PrefillAlgo::Chunked } else { PrefillAlgo::ChunkedBf16 };
        if args.profile_seqs > 1 {
            let slots: Vec<_> = std::iter::once(Some(slot))
                .chain((1..args.profile_seqs).map(|_| pool.allocate()))
                .collect::<Option<_>>()
                .ok_or_else(|| anyhow::anyhow!("--profile-seqs: a pool of 64"))?;
            let prompts: Vec<(_, &[u32])> = slots.iter().map(|&s| (s, &tokens[..512])).collect();
            let pieces: Vec<(_, &[u32])> = slots.iter().map(|&s| (s, profiled)).collect();
            model.prefill_many_with(&mut pool, &prompts, algo, &[])?;
            model.prefill_many_with(&mut pool, &pieces, algo, &[])?;
            dev.synchronize()?;
            profiler_start()?;
            model.prefill_many_with(&mut pool, &pieces, algo, &[])?;
            dev.synchronize()?;
            profiler_stop()?;
            return Ok(());
        }
        model.prefill(&mut pool, slot, &tokens, Logits::Last, algo)?;
        model.prefill(&mut pool, slot, profiled, Logits::Last, algo)?;
        dev.synchronize()?;
        profiler_start()?;
        model.prefill(&mut pool, slot, profiled, Logits::Last, algo)?;
        dev.synchronize()?;
        profiler_stop()?;
        return Ok(());
    }
    let algos: &[_] = if args.no_prefill {
        &[]
    } else {
        &[(PrefillAlgo::Chunked, "near-fp32 mixer"), (PrefillAlgo::ChunkedBf16, "bf16 mixer, `--mixer-precision bf16`")]
    };
    for &(algo, what) in algos {
        let ms = median_ms(dev, 5, || {
            model.prefill(&mut pool, slot, &tokens, Logits::Last, algo)?;
            Ok(())
        })?;
        println!("prefill B=1, T={t} ({what}): {ms:.1} ms = {:.1} k tokens/s", t as f64 / ms);
    }
    pool.release(slot)?;
    #[cfg(feature = "cuda")]
    if args.prefill_graph {
        for &(algo, _) in algos {
            prefill_graph_line(&model, &mut pool, dev, &tokens, algo, args.reps)?;
        }
    }
    println!();
    println!("| batch | CUDA graph | ms per step | tokens/s | roofline tokens/s | % of roofline |");
    println!("|---|---|---|---|---|---|");
    // The same figures unrounded, one `OURS {json}` line each after the table (benches/ab_summary.py).
    let mut figures = Vec::new();
    for &b in args.batches.as_deref().unwrap_or(&[1, 16, 64]) {
        let slots: Vec<_> =
            (0..b).map(|_| pool.allocate()).collect::<Option<_>>().ok_or_else(|| anyhow::anyhow!("batch {b}: the pool is full"))?;
        let batch: Vec<_> = slots.iter().enumerate().map(|(i, s)| (*s, (i as u32 * 31 + 7) % 32000)).collect();
        let roof_ms = (weight_bytes + b as f64 * state_bytes * 2.0) / copy_bw(dev)? * 1e3;
        let modes: &[bool] = if args.graphs_only { &[true] } else { &[false, true] };
        for &graphs in modes {
            #[cfg(feature = "cuda")]
            let mut captured = deltaserve_engine::decode_graph::DecodeGraphs::default();
            // median_ms warms up first: the eager run and the capture happen there.
            let ms = median_ms(dev, args.reps, || {
                #[cfg(feature = "cuda")]
                if graphs {
                    captured.decode_in_place(&model, &mut pool, &batch)?;
                    return Ok(());
                }
                model.decode(&mut pool, &batch)?;
                Ok(())
            })?;
            #[cfg(feature = "cuda")]
            if graphs {
                eprintln!("batch {b}: graph {:?}", captured.overlap());
            }
            let tps = b as f64 / ms * 1e3;
            let mode = if graphs { "yes" } else { "no" };
            println!("| {b} | {mode} | {ms:.2} | {tps:.0} | {:.0} | {:.0}% |", b as f64 / roof_ms * 1e3, 100.0 * roof_ms / ms);
            figures.push(serde_json::json!({"what": "decode", "batch": b, "cuda_graph": graphs, "ms": ms, "roofline_ms": roof_ms}));
        }
        for s in slots {
            pool.release(s)?;
        }
    }
    println!();
    for f in figures {
        println!("OURS {f}");
    }
    Ok(())
}

/// Which of the hybrid section's runs are profiled.
#[cfg(feature = "cuda")]
#[derive(Clone, Copy)]
pub(super) struct HybridProfile {
    /// The bf16-mixer prefill and every decode batch.
    pub(super) all: bool,
    /// Only the bf16-mixer prefill.
    pub(super) prefill: bool,
    /// Only the decode step of this batch.
    pub(super) decode: Option<usize>,
}

/// A T-token prefill's host enqueue time (until `prefill` returns, before the GPU is done)
/// and its wall time, eagerly and (where the model's layers allow a captured prefill) replayed
/// from a CUDA graph, alternating, medians of `reps`: an `OURS {"what": "prefill_graph", ...}`
/// line (`graph_ms` null without a graph).
#[cfg(feature = "cuda")]
fn prefill_graph_line(
    model: &CausalLm,
    pool: &mut deltaserve_engine::StatePool,
    dev: &Device,
    tokens: &[u32],
    algo: PrefillAlgo,
    reps: usize,
) -> anyhow::Result<()> {
    use deltaserve_engine::prefill_graph::{Buckets, PrefillGraphs};
    let mut graphs = PrefillGraphs::new(Buckets::new(tokens.len(), 0));
    // Host ms until the pass is enqueued and wall ms until the GPU is done; `None` when the
    // graph was asked for and the pass has none.
    let mut run = |graph: bool, pool: &mut deltaserve_engine::StatePool| -> anyhow::Result<Option<(f64, f64)>> {
        let slot = pool.allocate().ok_or_else(|| anyhow::anyhow!("empty pool"))?;
        dev.synchronize()?;
        let t0 = Instant::now();
        let logits = match graph {
            true => graphs.prefill(model, pool, &[(slot, tokens)], algo, &[])?,
            false => Some(model.prefill(pool, slot, tokens, Logits::Last, algo)?),
        };
        let enqueue = t0.elapsed().as_secs_f64() * 1e3;
        dev.synchronize()?;
        let wall = t0.elapsed().as_secs_f64() * 1e3;
        pool.release(slot)?;
        Ok(logits.map(|_| (enqueue, wall)))
    };
    // Warm the graph's shape: once from fixed tables, once captured.
    let captured = run(true, pool)?.is_some() && run(true, pool)?.is_some();
    let (mut enqueue, mut eager, mut graph) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps.max(1) {
        if let Some((e, w)) = run(false, pool)? {
            enqueue.push(e);
            eager.push(w);
        }
        if captured {
            graph.extend(run(true, pool)?.map(|(_, w)| w));
        }
    }
    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    println!(
        "OURS {}",
        serde_json::json!({"what": "prefill_graph", "tokens": tokens.len(), "algo": format!("{algo:?}"),
            "enqueue_ms": med(enqueue), "eager_ms": med(eager), "graph_ms": med(graph)})
    );
    Ok(())
}

/// The hybrid section: a Qwen3.5-layout checkpoint (dense or MoE), bf16. Decode runs at a
/// context of `ctx` tokens (each sequence prefilled first); the roofline counts weights read
/// once (of an MoE's routed experts, those the batch's tokens choose), each sequence's recurrent
/// state read and written, and its KV cache read, once a step.
#[cfg(feature = "cuda")]
pub(super) fn hybrid_table(dev: &Device, dir: &std::path::Path, args: &Args, profile: HybridProfile) -> anyhow::Result<()> {
    use candle_core::cuda_backend::cudarc::driver::{profiler_start, profiler_stop};
    let (reps, invariant_too) = (args.reps, args.batch_invariant);
    let cfg = deltaserve_engine::read_config(dir)?;
    let ckpt = deltaserve_engine::weights::Checkpoint::open(dir)?;
    let mut model = CausalLm::load(&cfg, &ckpt, DType::BF16, dev, false)?;
    model.set_state_dtype(deltaserve_engine::parse_dtype(&args.state_dtype)?)?;
    let size_of = |n: &String| ckpt.shape(n).map(|s| s.iter().product::<usize>()).unwrap_or(0);
    let params: usize = ckpt.names().iter().map(size_of).sum();
    // MoE: a step reads the routed experts its tokens chose. With k of E chosen per token, b
    // tokens touch E·(1 − (1 − k/E)^b) experts of a layer in expectation (uniform routing).
    let expert_params: usize = ckpt.names().iter().filter(|n| n.contains(".mlp.experts.")).map(size_of).sum();
    let moe = cfg.mlps.iter().find_map(|m| match m {
        deltaserve_engine::config::MlpKind::Sparse(s) => Some(*s),
        _ => None,
    });
    let touched = |b: usize| match moe {
        Some(s) => 1.0 - (1.0 - s.top_k as f64 / s.num_experts as f64).powi(b as i32),
        None => 1.0,
    };
    let weight_bytes = |b: usize| ((params - expert_params) as f64 + expert_params as f64 * touched(b)) * 2.0;
    // Conv states f32, recurrent states as `--state-dtype` keeps them.
    let state_bytes = model.cache_specs().iter().map(|s| s.bytes_per_sequence()).sum::<usize>() as f64;
    if args.mixed_passes {
        return super::passes::mixed_pass_table(&model, dev, reps);
    }
    if args.prefill_graphs {
        return super::passes::prefill_graph_table(&model, dev, reps);
    }
    let vocab = cfg.common.vocab_size as u32;
    let (t, ctx) = (4096usize, 256usize);
    let default: &[usize] = if moe.is_some() { &[1, 16, 64] } else { &[1, 64] };
    let batches = args.batches.as_deref().unwrap_or(default);
    let size = deltaserve_engine::state::PoolSize::for_tokens(64, t + 64);
    let mut pool = model.new_pool_sized(size)?;
    let kv_per_token = pool.bytes_per_block() as f64 / pool.block_size() as f64;
    println!(
        "OURS {}",
        serde_json::json!({"what": "model", "params": params, "state_bytes": state_bytes, "kv_bytes_per_token": kv_per_token,
            "copy_bw": copy_bw(dev)?})
    );
    let tokens: Vec<u32> = (0..t as u32).map(|i| (i * 7919 + 13) % vocab).collect();
    for bi in if invariant_too { vec![false, true] } else { vec![false] } {
        deltaserve_kernels::ops::set_batch_invariant(bi);
        let algos: &[PrefillAlgo] = if args.no_prefill { &[] } else { &[PrefillAlgo::Chunked, PrefillAlgo::ChunkedBf16] };
        for &algo in algos {
            let ms = median_ms(dev, 5, || {
                let slot = pool.allocate().ok_or_else(|| anyhow::anyhow!("empty pool"))?;
                model.prefill(&mut pool, slot, &tokens, Logits::Last, algo)?;
                pool.release(slot)?;
                Ok(())
            })?;
            println!(
                "OURS {}",
                serde_json::json!({"what": "prefill", "tokens": t, "algo": format!("{algo:?}"), "ms": ms, "batch_invariant": bi})
            );
            if args.prefill_graph && !bi {
                prefill_graph_line(&model, &mut pool, dev, &tokens, algo, reps)?;
            }
            if (profile.all || profile.prefill) && !bi && algo == PrefillAlgo::ChunkedBf16 {
                let slot = pool.allocate().ok_or_else(|| anyhow::anyhow!("empty pool"))?;
                dev.synchronize()?;
                profiler_start()?;
                model.prefill(&mut pool, slot, &tokens, Logits::Last, algo)?;
                dev.synchronize()?;
                profiler_stop()?;
                pool.release(slot)?;
            }
        }
        for &b in batches {
            let slots: Vec<_> =
                (0..b).map(|_| pool.allocate()).collect::<Option<_>>().ok_or_else(|| anyhow::anyhow!("batch {b}: the pool holds 64"))?;
            for (i, s) in slots.iter().enumerate() {
                let prompt: Vec<u32> = (0..ctx as u32).map(|j| (j * 131 + i as u32 * 7 + 1) % vocab).collect();
                model.prefill(&mut pool, *s, &prompt, Logits::Last, PrefillAlgo::Chunked)?;
            }
            let batch: Vec<_> = slots.iter().enumerate().map(|(i, s)| (*s, (i as u32 * 31 + 7) % vocab)).collect();
            let mut graphs = deltaserve_engine::decode_graph::DecodeGraphs::default();
            // Each step advances the sequences: the context grows from `ctx` by `3 + reps` tokens.
            let ms = median_ms(dev, reps, || {
                graphs.decode_in_place(&model, &mut pool, &batch)?;
                Ok(())
            })?;
            let kv = b as f64 * (ctx + 3 + reps / 2) as f64 * kv_per_token;
            let roof_ms = (weight_bytes(b) + b as f64 * state_bytes * 2.0 + kv) / copy_bw(dev)? * 1e3;
            let json = serde_json::json!({"what": "decode", "batch": b, "context": ctx, "ms": ms, "roofline_ms": roof_ms,
                "weight_bytes": weight_bytes(b), "captured": graphs.captured(), "graph": format!("{:?}", graphs.overlap()), "batch_invariant": bi});
            println!("OURS {json}");
            if (profile.all || profile.decode == Some(b)) && !bi {
                dev.synchronize()?;
                profiler_start()?;
                graphs.decode_in_place(&model, &mut pool, &batch)?;
                dev.synchronize()?;
                profiler_stop()?;
            }
            for s in slots {
                pool.release(s)?;
            }
        }
    }
    deltaserve_kernels::ops::set_batch_invariant(false);
    Ok(())
}

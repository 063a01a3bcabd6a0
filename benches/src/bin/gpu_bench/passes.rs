//! Whole prefill passes of the model: short packed passes as the server batches prompt chunks,
//! and where a pass's host time goes (enqueueing its launches against the GPU's work).

use candle_core::Device;
use deltaserve_engine::{CausalLm, PrefillAlgo};

use super::median_ms;

/// Short packed prefills of the whole model: B sequences of T tokens each in one pass, host
/// time to the logits on the host (what a server step waits for), per mixer precision; the
/// snapshot column captures every 64-token grid point of each sequence on the way.
pub(super) fn small_prefill_table(model: &CausalLm, dev: &Device, reps: usize) -> anyhow::Result<()> {
    use deltaserve_engine::SnapshotAt;
    println!("| B | T | mixer | snapshots | ms | k tokens/s |");
    println!("|---|---|---|---|---|---|");
    let vocab = model.config().common.vocab_size as u32;
    for (b, t) in [(1usize, 64usize), (1, 84), (1, 256), (1, 512), (1, 2048), (4, 512), (8, 64), (8, 160), (8, 256), (16, 128), (32, 64)] {
        let size = deltaserve_engine::state::PoolSize { snapshots: b * (t / 64), ..deltaserve_engine::state::PoolSize::for_tokens(b, t) };
        let mut pool = model.new_pool_sized(size)?;
        let tokens: Vec<Vec<u32>> = (0..b).map(|s| (0..t as u32).map(|i| (i * 7919 + 13 + s as u32 * 101) % vocab).collect()).collect();
        for algo in [PrefillAlgo::Chunked, PrefillAlgo::ChunkedBf16] {
            for snap in [false, true] {
                let ms = median_ms(dev, reps, || {
                    // Fresh (zeroed) slots each time, as new requests get.
                    let slots: Vec<_> = (0..b).filter_map(|_| pool.allocate()).collect();
                    let batch: Vec<_> = slots.iter().zip(&tokens).map(|(s, t)| (*s, t.as_slice())).collect();
                    let mut at = Vec::new();
                    if snap {
                        for seq in 0..b {
                            for k in 1..=t / 64 {
                                let id = pool.take_snapshot().ok_or_else(|| anyhow::anyhow!("no snapshot slot"))?;
                                at.push(SnapshotAt { seq, tokens: k * 64, snap: id });
                            }
                        }
                    }
                    let logits = model.prefill_many_with(&mut pool, &batch, algo, &at)?;
                    let _host = logits.to_vec2::<f32>()?;
                    for a in at {
                        pool.drop_snapshot(a.snap)?;
                    }
                    for s in slots {
                        pool.release(s)?;
                    }
                    Ok(())
                })?;
                println!("| {b} | {t} | {algo:?} | {snap} | {ms:.2} | {:.1} |", (b * t) as f64 / ms);
            }
        }
    }
    // A server's cached turn: restore a 2,048-token prefix from its snapshot, then prefill
    // the rest of the turn (not a multiple of 64 tokens) from there.
    println!("\n| continued from | T | mixer | restore | ms |");
    println!("|---|---|---|---|---|");
    let size = deltaserve_engine::state::PoolSize { snapshots: 1, ..deltaserve_engine::state::PoolSize::for_tokens(1, 4096) };
    let mut pool = model.new_pool_sized(size)?;
    let prefix: Vec<u32> = (0..2048u32).map(|i| (i * 7919 + 13) % 32000).collect();
    let slot = pool.allocate().ok_or_else(|| anyhow::anyhow!("empty pool"))?;
    let snap = pool.take_snapshot().ok_or_else(|| anyhow::anyhow!("no snapshot slot"))?;
    model.prefill_many_with(&mut pool, &[(slot, &prefix)], PrefillAlgo::Chunked, &[SnapshotAt { seq: 0, tokens: 2048, snap }])?;
    for t in [51usize, 64, 84, 128] {
        let rest: Vec<u32> = (0..t as u32).map(|i| (i * 31 + 5) % 32000).collect();
        for algo in [PrefillAlgo::Chunked, PrefillAlgo::ChunkedBf16] {
            for restore in [false, true] {
                let ms = median_ms(dev, reps, || {
                    if restore {
                        pool.restore(snap, slot)?;
                    }
                    let _host = model.prefill_many_with(&mut pool, &[(slot, &rest)], algo, &[])?.to_vec2::<f32>()?;
                    Ok(())
                })?;
                println!("| 2048 | {t} | {algo:?} | {restore} | {ms:.2} |");
            }
        }
    }
    Ok(())
}

/// Short passes eagerly and from CUDA graphs, alternating, ms to the logits on the host
/// (bf16 mixer): a chat turn of T tokens continued from a restored 2,048-token prefix, and B
/// fresh prompts of T tokens packed in one pass. Graph shapes are warmed (run from fixed
/// tables, then captured) before timing.
#[cfg(feature = "cuda")]
pub(super) fn prefill_graph_table(model: &CausalLm, dev: &Device, reps: usize) -> anyhow::Result<()> {
    use deltaserve_engine::prefill_graph::{Buckets, PrefillGraphs};
    use deltaserve_engine::SnapshotAt;
    let algo = PrefillAlgo::ChunkedBf16;
    let vocab = model.config().common.vocab_size as u32;
    let mut graphs = PrefillGraphs::new(Buckets::new(256, 0));
    let size = deltaserve_engine::state::PoolSize { snapshots: 1, ..deltaserve_engine::state::PoolSize::for_tokens(10, 4096) };
    let mut pool = model.new_pool_sized(size)?;
    let prefix: Vec<u32> = (0..2048u32).map(|i| (i * 7919 + 13) % vocab).collect();
    let slot = pool.allocate().ok_or_else(|| anyhow::anyhow!("empty pool"))?;
    let snap = pool.take_snapshot().ok_or_else(|| anyhow::anyhow!("no snapshot slot"))?;
    model.prefill_many_with(&mut pool, &[(slot, &prefix)], algo, &[SnapshotAt { seq: 0, tokens: 2048, snap }])?;
    println!("| pass | eager ms | graph ms | eager / graph |");
    println!("|---|---|---|---|");
    let mut row = |what: String, run: &mut dyn FnMut(bool, &mut deltaserve_engine::StatePool, &mut PrefillGraphs) -> anyhow::Result<()>| {
        // Warm the shape: once from fixed tables, once captured.
        for _ in 0..2 {
            run(true, &mut pool, &mut graphs)?;
        }
        let (mut eager, mut graph) = (Vec::new(), Vec::new());
        for _ in 0..reps.max(1) {
            eager.push(median_ms(dev, 1, || run(false, &mut pool, &mut graphs))?);
            graph.push(median_ms(dev, 1, || run(true, &mut pool, &mut graphs))?);
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (e, g) = (med(&mut eager), med(&mut graph));
        println!("| {what} | {e:.2} | {g:.2} | {:.2}× |", e / g);
        anyhow::Ok(())
    };
    for t in [51usize, 84, 100, 128, 200] {
        let rest: Vec<u32> = (0..t as u32).map(|i| (i * 31 + 5) % vocab).collect();
        row(format!("1 × {t}, continued from 2,048"), &mut |graph, pool, graphs| {
            pool.restore(snap, slot)?;
            let batch = [(slot, rest.as_slice())];
            let logits = match graph {
                true => graphs.prefill(model, pool, &batch, algo, &[])?.ok_or_else(|| anyhow::anyhow!("no graph for 1 × {t}"))?,
                false => model.prefill_many_with(pool, &batch, algo, &[])?,
            };
            let _host = logits.to_vec2::<f32>()?;
            Ok(())
        })?;
    }
    for (b, t) in [(4usize, 50usize), (8, 30), (2, 100)] {
        let prompts: Vec<Vec<u32>> = (0..b).map(|s| (0..t as u32).map(|i| (i * 7919 + 13 + s as u32 * 101) % vocab).collect()).collect();
        row(format!("{b} × {t}, fresh"), &mut |graph, pool, graphs| {
            let slots: Vec<_> = (0..b).filter_map(|_| pool.allocate()).collect();
            let batch: Vec<_> = slots.iter().zip(&prompts).map(|(s, p)| (*s, p.as_slice())).collect();
            let logits = match graph {
                true => graphs.prefill(model, pool, &batch, algo, &[])?.ok_or_else(|| anyhow::anyhow!("no graph for {b} × {t}"))?,
                false => model.prefill_many_with(pool, &batch, algo, &[])?,
            };
            let _host = logits.to_vec2::<f32>()?;
            for s in slots {
                pool.release(s)?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// A named op call, timed by [`per_call_us`].
#[cfg(feature = "cuda")]
type Case<'a> = (&'static str, Box<dyn FnMut() -> anyhow::Result<()> + 'a>);

/// A timed call's result, dropped.
#[cfg(feature = "cuda")]
pub(super) fn done<T, E: Into<anyhow::Error>>(r: Result<T, E>) -> anyhow::Result<()> {
    r.map(drop).map_err(Into::into)
}

/// Host microseconds a call to enqueue `f` (`calls` calls back to back, no synchronisation
/// between them) and wall microseconds a call once the GPU has finished them all.
#[cfg(feature = "cuda")]
fn per_call_us(dev: &Device, calls: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<(f64, f64)> {
    for _ in 0..3 {
        f()?;
    }
    dev.synchronize()?;
    let t0 = std::time::Instant::now();
    for _ in 0..calls {
        f()?;
    }
    let enqueue = t0.elapsed().as_secs_f64();
    dev.synchronize()?;
    let wall = t0.elapsed().as_secs_f64();
    Ok((enqueue * 1e6 / calls as f64, wall * 1e6 / calls as f64))
}

/// Where a short prefill pass's time goes: the host's time to enqueue the whole pass against
/// the pass's wall time to the logits on the host, with cudarc's per-allocation event tracking
/// on (candle's default) and off; then the host cost of single ops at a pass's row counts.
#[cfg(feature = "cuda")]
pub(super) fn host_cost_table(model: &CausalLm, dev: &Device, reps: usize) -> anyhow::Result<()> {
    use candle_core::{DType, Tensor};
    use deltaserve_kernels::{ops, GateActivation};
    let Device::Cuda(cuda) = dev else { anyhow::bail!("host_cost_table needs a CUDA device") };
    let ctx = cuda.cuda_stream().context().clone();
    // SAFETY: one stream, so there is nothing for the events to order.
    let track = |on: bool| unsafe {
        if on {
            ctx.enable_event_tracking()
        } else {
            ctx.disable_event_tracking()
        }
    };
    let vocab = model.config().common.vocab_size as u32;
    println!("| event tracking | B | T | enqueue ms | wall ms |");
    println!("|---|---|---|---|---|");
    for tracking in [true, false] {
        track(tracking);
        for (b, t) in [(1usize, 64usize), (1, 512), (4, 512), (8, 64)] {
            let mut pool = model.new_pool_sized(deltaserve_engine::state::PoolSize::for_tokens(b, t))?;
            let tokens: Vec<Vec<u32>> = (0..b).map(|s| (0..t as u32).map(|i| (i * 7919 + 13 + s as u32 * 101) % vocab).collect()).collect();
            let slots: Vec<_> = (0..b).filter_map(|_| pool.allocate()).collect();
            let batch: Vec<_> = slots.iter().zip(&tokens).map(|(s, t)| (*s, t.as_slice())).collect();
            let (mut enq, mut wall) = (Vec::new(), Vec::new());
            for i in 0..reps + 3 {
                dev.synchronize()?;
                let t0 = std::time::Instant::now();
                let logits = model.prefill_many_with(&mut pool, &batch, PrefillAlgo::ChunkedBf16, &[])?;
                let e = t0.elapsed().as_secs_f64() * 1e3;
                let _host = logits.to_vec2::<f32>()?;
                if i >= 3 {
                    enq.push(e);
                    wall.push(t0.elapsed().as_secs_f64() * 1e3);
                }
            }
            enq.sort_by(f64::total_cmp);
            wall.sort_by(f64::total_cmp);
            println!("| {tracking} | {b} | {t} | {:.2} | {:.2} |", enq[enq.len() / 2], wall[wall.len() / 2]);
        }
    }
    // A server's passes rarely repeat a length: the first pass at each new length (new GEMM
    // shapes for cuBLAS, new allocation sizes) against the pass repeated at once.
    println!("\n| T (a new length each row) | first pass: enqueue / wall ms | repeated: enqueue / wall ms |");
    println!("|---|---|---|");
    let mut pool = model.new_pool_sized(deltaserve_engine::state::PoolSize::for_tokens(1, 256))?;
    let slot = pool.allocate().ok_or_else(|| anyhow::anyhow!("empty pool"))?;
    for t in [53usize, 67, 79, 94, 101, 117, 133, 150] {
        let tokens: Vec<u32> = (0..t as u32).map(|i| (i * 7919 + 13) % vocab).collect();
        let mut cells = Vec::new();
        for _ in 0..2 {
            dev.synchronize()?;
            let t0 = std::time::Instant::now();
            let logits = model.prefill_many_with(&mut pool, &[(slot, &tokens)], PrefillAlgo::ChunkedBf16, &[])?;
            let e = t0.elapsed().as_secs_f64() * 1e3;
            let _host = logits.to_vec2::<f32>()?;
            cells.push(format!("{e:.2} / {:.2}", t0.elapsed().as_secs_f64() * 1e3));
        }
        println!("| {t} | {} | {} |", cells[0], cells[1]);
    }
    println!("\n| event tracking | op | rows | host µs a call | wall µs a call |");
    println!("|---|---|---|---|---|");
    let d = 2048;
    for tracking in [true, false] {
        track(tracking);
        for rows in [64usize, 512] {
            let x = Tensor::randn(0f32, 1.0, (rows, d), dev)?.to_dtype(DType::BF16)?;
            let h = Tensor::randn(0f32, 1.0, (rows, d), dev)?;
            let nw = Tensor::ones(d, DType::F32, dev)?;
            let w = (Tensor::randn(0f32, 0.02, (9228, d), dev)?).to_dtype(DType::BF16)?;
            let gu = Tensor::randn(0f32, 1.0, (rows, 2 * 5632), dev)?.to_dtype(DType::BF16)?;
            let o = Tensor::randn(0f32, 1.0, (rows, 6, 512), dev)?;
            let z = Tensor::randn(0f32, 1.0, (rows, 3072), dev)?.to_dtype(DType::BF16)?;
            let ow = Tensor::ones(512, DType::F32, dev)?;
            let idx: Vec<i32> = (0..24).collect();
            let mut cases: Vec<Case<'_>> = vec![
                ("Tensor::zeros bf16 [rows, 2048]", Box::new(|| done(Tensor::zeros((rows, d), DType::BF16, dev)))),
                ("upload 24 i32 (an index table)", Box::new(|| done(Tensor::new(idx.as_slice(), dev)))),
                ("to_dtype bf16 → f32 [rows, 2048]", Box::new(|| done(x.to_dtype(DType::F32)))),
                ("narrow + contiguous [rows, 2048] of [rows, 11264]", Box::new(|| done(gu.narrow(1, 5632, d)?.contiguous()))),
                ("linear (cuBLAS) [rows, 2048] × [9228, 2048]ᵀ", Box::new(|| done(ops::linear(&x, &w)))),
                ("add_rms_norm", Box::new(|| done(ops::add_rms_norm(&h, Some(&x), &nw, 1e-6, DType::BF16)))),
                ("swiglu [rows, 5632] slices", Box::new(|| done(ops::swiglu(&gu.narrow(1, 0, 5632)?, &gu.narrow(1, 5632, 5632)?)))),
                (
                    "gated_rms_norm 6 × 512",
                    Box::new(|| done(ops::gated_rms_norm(&o, Some(&z), &ow, 1e-6, GateActivation::Sigmoid, DType::BF16))),
                ),
            ];
            for (name, f) in cases.iter_mut() {
                let (host, wall) = per_call_us(dev, 300, f)?;
                println!("| {tracking} | {name} | {rows} | {host:.1} | {wall:.1} |");
            }
        }
    }
    track(true);
    Ok(())
}

/// A prompt piece of T tokens (a fresh sequence) beside a decode step of B running sequences,
/// as the server runs them, ms to both logits on the host (bf16 mixer): two passes (the
/// prefill eagerly, then the decode step from its CUDA graph), one mixed pass run eagerly, and
/// the same mixed pass replayed from its CUDA graph, alternating.
#[cfg(feature = "cuda")]
pub(super) fn mixed_pass_table(model: &CausalLm, dev: &Device, reps: usize) -> anyhow::Result<()> {
    use deltaserve_engine::decode_graph::DecodeGraphs;
    use deltaserve_engine::prefill_graph::{Buckets, PrefillGraphs};
    let algo = PrefillAlgo::ChunkedBf16;
    let vocab = model.config().common.vocab_size as u32;
    println!(
        "| prompt piece T | decode batch B | two passes ms | mixed pass, eager ms | mixed pass, graph ms | two / eager | eager / graph |"
    );
    println!("|---|---|---|---|---|---|---|");
    #[derive(Clone, Copy)]
    enum How {
        Two,
        Eager,
        Graph,
    }
    for b in [1usize, 16, 32, 64] {
        // The running sequences, the piece's slot and the graph's padding slot (a hybrid's KV
        // for 2,048 tokens each: the warm-up, the pieces and the steps).
        let mut pool = model.new_pool_sized(deltaserve_engine::state::PoolSize::for_tokens(b + 2, 2048))?;
        let running: Vec<_> = (0..b).filter_map(|_| pool.allocate()).collect();
        let warm: Vec<u32> = (0..64u32).map(|i| (i * 131 + 17) % vocab).collect();
        for s in &running {
            model.prefill(&mut pool, *s, &warm, deltaserve_engine::Logits::Last, algo)?;
        }
        let step: Vec<_> = running.iter().enumerate().map(|(i, s)| (*s, (i as u32 * 31 + 7) % vocab)).collect();
        let mut graphs = DecodeGraphs::default();
        let mut mixed = PrefillGraphs::new(Buckets::new(0, 512));
        for t in [64usize, 256, 512] {
            let prompt: Vec<u32> = (0..t as u32).map(|i| (i * 7919 + 13) % vocab).collect();
            let mut run = |how: How, pool: &mut deltaserve_engine::StatePool| -> anyhow::Result<()> {
                let slot = pool.allocate().ok_or_else(|| anyhow::anyhow!("no free slot"))?;
                let piece = [(slot, prompt.as_slice())];
                match how {
                    How::Two => {
                        let first = model.prefill_many(pool, &piece, algo)?;
                        let next = graphs.decode(model, pool, &step)?;
                        let (_a, _b) = (first.to_vec2::<f32>()?, next.to_vec2::<f32>()?);
                    }
                    How::Eager => {
                        let _host = model.prefill_and_decode(pool, &piece, algo, &[], &step)?.to_vec2::<f32>()?;
                    }
                    How::Graph => {
                        let out = mixed.prefill_and_decode(model, pool, &piece, algo, &[], &step)?;
                        let _host = out.ok_or_else(|| anyhow::anyhow!("T={t} B={b}: no mixed graph"))?.to_vec2::<f32>()?;
                    }
                }
                pool.release(slot)?;
                Ok(())
            };
            // Warms each: the graph's shape runs from fixed tables, then is captured.
            for how in [How::Two, How::Eager, How::Graph, How::Two, How::Eager, How::Graph] {
                run(how, &mut pool)?;
            }
            let (mut two, mut one, mut graph) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..reps.max(1) {
                two.push(super::median_ms(dev, 1, || run(How::Two, &mut pool))?);
                one.push(super::median_ms(dev, 1, || run(How::Eager, &mut pool))?);
                graph.push(super::median_ms(dev, 1, || run(How::Graph, &mut pool))?);
            }
            let med = |v: &mut Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            let (a, m, g) = (med(&mut two), med(&mut one), med(&mut graph));
            println!("| {t} | {b} | {a:.2} | {m:.2} | {g:.2} | {:.2}× | {:.2}× |", a / m, m / g);
        }
    }
    Ok(())
}

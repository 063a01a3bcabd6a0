//! Tensor parallel benchmark: loads a checkpoint through the engine split over N GPUs (N = 1 for
//! the baseline) and times what serving runs: a prefill of one T-token prompt and CUDA-graph
//! decode steps at several batch sizes. One `TP {json}` line per figure, so runs at several N
//! in one GPU call compare side by side (`benches/tensor_parallel.sh`).
//!
//! `tp_bench --model DIR --tensor-parallel-size N [--device cuda] [--dtype bf16]`

use std::time::Instant;

use clap::Parser;
use deltaserve_engine::tensor_parallel::ExpertSplit;
use deltaserve_engine::{parse_device, parse_dtype, Engine, LoadOptions, Logits, PrefillAlgo};
use rand::{Rng, SeedableRng};

#[derive(Debug, Parser)]
struct Args {
    /// Checkpoint directory.
    #[arg(long)]
    model: String,
    /// GPUs to split the model over.
    #[arg(long, default_value_t = 1)]
    tensor_parallel_size: usize,
    /// First device.
    #[arg(long, default_value = "cuda")]
    device: String,
    /// Compute dtype.
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Prompt tokens of the timed prefill.
    #[arg(long, default_value_t = 4096)]
    prefill: usize,
    /// Decode batch sizes.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    batches: Vec<usize>,
    /// Timed repetitions (the median is reported).
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Decode steps per timed repetition.
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Decode eagerly, without CUDA graphs.
    #[arg(long)]
    no_cuda_graphs: bool,
    /// MoE layers split by whole experts (`on`), by every expert's channels (`off`), or by
    /// whole experts where the ranks divide them (`auto`).
    #[arg(long, default_value = "auto")]
    expert_parallel: String,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    deltaserve_engine::load_kernels_eagerly_for(args.tensor_parallel_size);
    // Progress on stderr (`DELTASERVE_LOG=debug` shows each step), so a hang shows where it is.
    let filter = tracing_subscriber::EnvFilter::try_from_env("DELTASERVE_LOG").unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_thread_names(true).with_writer(std::io::stderr).init();
    let dtype = parse_dtype(&args.dtype)?;
    let split = match args.expert_parallel.as_str() {
        "auto" => ExpertSplit::Auto,
        "on" => ExpertSplit::Experts,
        "off" => ExpertSplit::Channels,
        other => anyhow::bail!("--expert-parallel: expected auto, on or off, got {other}"),
    };
    let t0 = Instant::now();
    let engine = Engine::load(&LoadOptions {
        model: args.model.clone(),
        dtype,
        state_dtype: deltaserve_engine::DType::F32,
        device: parse_device(&args.device)?,
        check_weights: false,
        prefill_algo: if dtype == deltaserve_engine::DType::F32 { PrefillAlgo::Chunked } else { PrefillAlgo::ChunkedBf16 },
        cuda_graphs: !args.no_cuda_graphs,
        prefill_graph_tokens: deltaserve_engine::DEFAULT_PREFILL_GRAPH_TOKENS,
        mixed_graph_tokens: deltaserve_engine::DEFAULT_MIXED_GRAPH_TOKENS,
        batch_invariant: false,
        tensor_parallel_size: args.tensor_parallel_size,
        expert_split: split,
    })?;
    let tp = args.tensor_parallel_size;
    let ep = args.expert_parallel.clone();
    let load_s = t0.elapsed().as_secs_f64();
    println!("TP {}", serde_json::json!({"tp": tp, "ep": ep, "what": "load", "secs": load_s}));
    let vocab = engine.config().common.vocab_size as u32;
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let prompt: Vec<u32> = (0..args.prefill).map(|_| rng.random_range(0..vocab)).collect();
    let max_batch = args.batches.iter().copied().max().unwrap_or(1);
    let size = deltaserve_engine::state::PoolSize::for_tokens(max_batch.max(1), args.prefill.max(64) + args.reps * args.steps + 64);
    let mut pool = engine.new_pool_sized(size)?;

    // Prefill: one prompt into a fresh slot each time.
    let mut times = Vec::new();
    for rep in 0..args.reps + 2 {
        let slot = pool.allocate().ok_or_else(|| anyhow::anyhow!("no slot"))?;
        engine.synchronize()?;
        let t = Instant::now();
        let logits = engine.prefill(&mut pool, slot, &prompt, Logits::Last)?;
        let _ = logits.to_vec1::<f32>()?;
        engine.synchronize()?;
        if rep >= 2 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        pool.release(slot)?;
    }
    let ms = median(times);
    println!(
        "TP {}",
        serde_json::json!({"tp": tp, "ep": ep, "what": "prefill", "tokens": args.prefill, "ms": ms, "tokens_per_s": args.prefill as f64 / ms * 1e3})
    );

    // Decode: B slots, each with a 16-token prompt, stepped together through the CUDA graphs.
    for &b in &args.batches {
        let slots: Vec<_> = (0..b).map_while(|_| pool.allocate()).collect();
        anyhow::ensure!(slots.len() == b, "only {} slots for batch {b}", slots.len());
        let short: Vec<Vec<u32>> = (0..b).map(|_| (0..16).map(|_| rng.random_range(0..vocab)).collect()).collect();
        let batch: Vec<_> = slots.iter().copied().zip(short.iter().map(Vec::as_slice)).collect();
        tracing::info!(batch = b, "prefilling the batch's prompts");
        engine.prefill_many(&mut pool, &batch)?;
        let step: Vec<_> = slots.iter().map(|&s| (s, 1u32)).collect();
        // Eager, capture, then replays.
        for i in 0..3 {
            tracing::info!(batch = b, step = i, "decode step (eager, capture, replay)");
            engine.decode(&mut pool, &step)?;
            engine.synchronize()?;
        }
        tracing::info!(batch = b, "timing");
        engine.synchronize()?;
        let mut times = Vec::new();
        for _ in 0..args.reps {
            let t = Instant::now();
            for _ in 0..args.steps {
                engine.decode(&mut pool, &step)?;
            }
            engine.synchronize()?;
            times.push(t.elapsed().as_secs_f64() * 1e3 / args.steps as f64);
        }
        let ms = median(times);
        println!(
            "TP {}",
            serde_json::json!({"tp": tp, "ep": ep, "what": "decode", "batch": b, "ms": ms, "tokens_per_s": b as f64 / ms * 1e3,
                               "graphs": engine.cuda_graph_batches().contains(&b)})
        );
        for s in slots {
            pool.release(s)?;
        }
    }
    Ok(())
}

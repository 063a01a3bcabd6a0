//! GPU benchmark: times our CUDA kernels and a whole model on the GPU and prints tables; the
//! mixer tables put fla's kernels beside ours when `--fla-json` gives fla's times from the same
//! run (`benches/mixer_vs_fla.sh` does both), and print no ratio otherwise.
//!
//! `cargo run --release -p deltaserve-benches --features cuda --bin gpu_bench -- [--skip-model]`
//!
//! - prefill mixer: `chunk_gated_delta_rule` shapes, B sequences packed in one launch;
//! - decode mixer step: one token for each of B slots, state traffic in GB/s;
//! - decode MLP down projection: SwiGLU and the small-batch projection, apart and fused;
//! - whole model: a random 1.3B-shape Gated DeltaNet (bf16), prefill T=4096 and decode at
//!   batch 1/16/64 against the decode roofline (weights + state read and written once per step).

use candle_core::{DType, Device, Tensor};
use clap::Parser;
use deltaserve_engine::PrefillAlgo;
use deltaserve_kernels::ops::{gated_delta_prefill_packed, gated_delta_step, MixerInputs};
use deltaserve_kernels::SlotBuffer;

#[cfg(feature = "cuda")]
mod gemm;
mod model;
mod passes;
mod timing;

use timing::{copy_bw, median_gpu_ms, median_ms, Timing};

#[derive(Debug, Parser)]
struct Args {
    /// Skip the whole-model section (it writes a 2.8 GB random checkpoint).
    #[arg(long)]
    skip_model: bool,
    /// Where the random 1.3B checkpoint goes (reused when present).
    #[arg(long, default_value = "/tmp/deltaserve-gdn-1.3b")]
    model_dir: std::path::PathBuf,
    /// Timed repetitions per point (the median is reported).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Only the decode mixer table (for comparing decode kernel shapes, picked with
    /// `DELTASERVE_DECODE_KERNEL=w8_r16_c4_b2` and the other shapes gated_delta.cu compiles).
    #[arg(long)]
    decode_only: bool,
    /// Only the prefill mixer table (for comparing state-pass variants, picked with
    /// `DELTASERVE_TC_WG=0`, `DELTASERVE_TC_BV` and `DELTASERVE_TC_DB`).
    #[arg(long)]
    prefill_mixer_only: bool,
    /// Load the whole model and run one T=4096 prefill with the bf16 mixer (the default for bf16
    /// models) between cuProfilerStart and cuProfilerStop, for `ncu --profile-from-start off`
    /// (`benches/prefill_profile.sh`); no tables.
    #[arg(long)]
    profile_prefill: bool,
    /// Profile the near-fp32 mixer's prefill (`--mixer-precision fp32`) instead of the bf16
    /// mixer's (`--profile-prefill`).
    #[arg(long)]
    profile_fp32: bool,
    /// Tokens of the profiled prefill (`--profile-prefill`), continuing a 4,096-token one when
    /// fewer than 4,096: a short pass as a cached chat turn runs it.
    #[arg(long, default_value_t = 4096)]
    profile_tokens: usize,
    /// Sequences of the profiled prefill (`--profile-prefill`): this many, each continuing a
    /// 512-token prompt by `--profile-tokens`, packed in one pass as the server packs prompts.
    #[arg(long, default_value_t = 1)]
    profile_seqs: usize,
    /// Load the whole model and replay one captured decode step of this batch size between
    /// cuProfilerStart and cuProfilerStop (for `ncu --profile-from-start off --graph-profiling
    /// node`; `benches/decode_profile.sh`); no tables.
    #[arg(long)]
    profile_decode: Option<usize>,
    /// Only the whole-model section.
    #[arg(long)]
    model_only: bool,
    /// Only the whole model's short packed prefills (B sequences of T tokens in one pass, as the
    /// server batches prompt chunks), each mixer precision, with and without grid snapshots.
    #[arg(long)]
    small_prefill: bool,
    /// Only the whole model's pass host costs: the host's time to enqueue a short prefill pass
    /// against its wall time, with cudarc's event tracking on and off, and single ops' host
    /// costs at a pass's row counts.
    #[arg(long)]
    host_cost: bool,
    /// Only short prefill passes eagerly against the same passes replayed from CUDA graphs
    /// (padded to 64/128/256 rows), ms to the logits on the host: chat turns continued from a
    /// 2,048-token prefix, and packed short prompts. On the 1.39B GDN, or with `--hybrid-dir`
    /// on that checkpoint.
    #[arg(long)]
    prefill_graphs: bool,
    /// Only a prompt piece beside a decode step of running sequences: two passes (prefill, then
    /// the decode step's CUDA graph), one mixed pass run eagerly and one replayed from its CUDA
    /// graph, ms to the logits on the host. On the 1.39B GDN, or with `--hybrid-dir` on that
    /// checkpoint.
    #[arg(long)]
    mixed_passes: bool,
    /// Only the prefill projections as GEMMs: candle's cuBLAS call against cublasLt at the
    /// model's shapes and a pass's row counts (`benches/gemm_torch.py` times PyTorch's).
    #[arg(long)]
    gemm_only: bool,
    /// Only the first GEMM at new row counts against the same call repeated (host ms).
    #[arg(long)]
    new_shapes: bool,
    /// Only the decode step's cublasLt projections (16 and 64 rows, the 1.39B's and Qwen3.5's
    /// shapes): each of the heuristic's first 8 algorithms timed, W streamed from memory; the
    /// 2,048-row ones also with an f32 output and in-place split-K.
    #[arg(long)]
    gemm_algos: bool,
    /// Only the decode step's projections and LM heads at 4–64 rows: the skinny GEMM in the
    /// shape it picks and in others against cuBLAS, W streamed from memory.
    #[arg(long)]
    skinny: bool,
    /// With `--gemm-algos`: these row counts instead (comma-separated; e.g. 4096 for a prefill's
    /// projections), each of the heuristic's first 16 algorithms in the default variant only.
    #[arg(long, value_delimiter = ',')]
    gemm_algos_rows: Vec<usize>,
    /// Only the decode-step fused projection tables (SwiGLU and down projection, norms and the
    /// projections after them: two kernels or one).
    #[arg(long)]
    mlp_only: bool,
    /// Only the hybrid section: the checkpoint in this directory (written by
    /// `benches/hybrid_vs_hf.py`, which runs transformers on the same weights in the same run),
    /// prefill T=4096 and graph decode at batch 1 and 64; one `OURS {json}` line per figure.
    #[arg(long)]
    hybrid_dir: Option<std::path::PathBuf>,
    /// With `--hybrid-dir`: after timing, run one bf16-mixer prefill and one graph decode step
    /// of each batch between cuProfilerStart and cuProfilerStop (for `ncu --profile-from-start
    /// off --graph-profiling node`).
    #[arg(long)]
    profile_hybrid: bool,
    /// With `--hybrid-dir`: profile only the graph decode step of this batch (no prefill), so
    /// that one `ncu` report holds one step (`benches/hybrid_profile.sh`).
    #[arg(long)]
    profile_hybrid_decode: Option<usize>,
    /// With `--hybrid-dir`: profile only the bf16-mixer prefill (`benches/hybrid_profile.sh
    /// --prefill`).
    #[arg(long)]
    profile_hybrid_prefill: bool,
    /// With `--model-only` or `--hybrid-dir`: also time each T=4096 prefill's host enqueue,
    /// and the same pass replayed from a CUDA graph where the model's layers allow one (how much
    /// of the pass is launch gaps and host work).
    #[arg(long)]
    prefill_graph: bool,
    /// With `--hybrid-dir`: time everything twice in one run, in the default mode and with
    /// `--batch-invariant` (lines with `"batch_invariant": true`).
    #[arg(long)]
    batch_invariant: bool,
    /// Only the paged-attention op at Qwen3.5's attention shape (8 query / 2 KV heads of 256,
    /// bf16): prefill T=4096 and decode at batch 1 and 64; one `OURS {json}` line per figure.
    #[arg(long)]
    attention_only: bool,
    /// Only the batched draw (64 rows of 151,936 logits, flat and peaked, under each rule)
    /// beside copying the logits to the host, which the draw replaced.
    #[arg(long)]
    sampling_only: bool,
    /// Decode batch sizes of the whole-model and hybrid tables (default 1, 16, 64 and 1, 64).
    #[arg(long, value_delimiter = ',')]
    batches: Option<Vec<usize>>,
    /// Whole-model and hybrid tables: decode only, no prefill.
    #[arg(long)]
    no_prefill: bool,
    /// Whole-model table: CUDA graphs only, no eager decode rows.
    #[arg(long)]
    graphs_only: bool,
    /// Whole-model and hybrid tables: the recurrent states' element type in the pool, f32 or
    /// bf16 (`serve --state-dtype`); the roofline counts the states' bytes in it.
    #[arg(long, default_value = "f32")]
    state_dtype: String,
    /// fla's times at the mixer tables' shapes, measured in this run by `benches/fla_mixer.py`
    /// (`benches/mixer_vs_fla.sh`): the "vs fla" columns are computed from them.
    #[arg(long)]
    fla_json: Option<std::path::PathBuf>,
}

/// A prefill mixer shape: B sequences of T tokens, H heads, key and value dims K and V.
type MixerShape = (usize, usize, usize, usize, usize);

/// fla's kernel times (ms) from `benches/fla_mixer.py`.
#[derive(Debug, Default)]
struct FlaTimes {
    /// Shape → ms.
    prefill: Vec<(MixerShape, f64)>,
    /// B → ms.
    decode: Vec<(usize, f64)>,
}

impl FlaTimes {
    fn load(path: &std::path::Path) -> anyhow::Result<Self> {
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
        let n = |e: &serde_json::Value, k: &str| {
            e[k].as_u64().map(|x| x as usize).ok_or_else(|| anyhow::anyhow!("{}: `{k}` missing", path.display()))
        };
        let ms = |e: &serde_json::Value| e["ms"].as_f64().ok_or_else(|| anyhow::anyhow!("{}: `ms` missing", path.display()));
        let mut t = Self::default();
        for e in v["prefill"].as_array().into_iter().flatten() {
            t.prefill.push(((n(e, "b")?, n(e, "t")?, n(e, "h")?, n(e, "k")?, n(e, "v")?), ms(e)?));
        }
        for e in v["decode"].as_array().into_iter().flatten() {
            t.decode.push((n(e, "b")?, ms(e)?));
        }
        Ok(t)
    }

    fn prefill_ms(&self, shape: MixerShape) -> Option<f64> {
        self.prefill.iter().find(|(s, _)| *s == shape).map(|x| x.1)
    }

    fn decode_ms(&self, b: usize) -> Option<f64> {
        self.decode.iter().find(|(x, _)| *x == b).map(|x| x.1)
    }
}

/// `x` with `digits` decimals, or a dash when there is none.
fn or_dash(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "—".into(), |x| format!("{x:.digits$}"))
}

/// The batched draw over 64 rows of Qwen's vocabulary size, host time to the tokens on the
/// host: flat rows (logits uniform in ±4) and peaked ones (a trained model's shape: logits in
/// −20..−12 with 100 tokens lifted by 22–30), beside copying the whole logits to the host.
fn sampling_table(dev: &Device, reps: usize) -> anyhow::Result<()> {
    use deltaserve_kernels::ops::sample::{sample, RowRule, SampleBatch};
    let (b, v) = (64usize, 151_936usize);
    println!("| rows | rule | draw ms | copy of the logits to the host, ms |");
    println!("|---|---|---|---|");
    let mut state = 7u64;
    let mut next = move || {
        state = deltaserve_kernels::cpu::sample::mix(state.wrapping_add(0x9E37_79B9_7F4A_7C15));
        (state >> 40) as f32 / 16_777_216.0
    };
    for peaked in [false, true] {
        let mut l: Vec<f32> = (0..b * v).map(|_| next() * 8.0 - 4.0 - if peaked { 16.0 } else { 0.0 }).collect();
        if peaked {
            for r in 0..b {
                for _ in 0..100 {
                    let at = r * v + (next() * v as f32) as usize % v;
                    l[at] += 22.0 + 8.0 * next();
                }
            }
        }
        let logits = Tensor::from_vec(l, (b, v), dev)?;
        let copy = median_ms(dev, reps, || {
            logits.to_vec2::<f32>()?;
            Ok(())
        })?;
        let base = RowRule { seed: 1, ..RowRule::default() };
        let rules = [
            ("greedy", RowRule { temperature: 0.0, ..base }),
            ("T = 1", base),
            ("T = 1, top-p 0.9", RowRule { top_p: 0.9, ..base }),
            ("T = 1, top-k 50", RowRule { top_k: 50, ..base }),
            ("greedy, 20 top logprobs", RowRule { temperature: 0.0, top_logprobs: 20, ..base }),
        ];
        for (name, rule) in rules {
            let rs: Vec<RowRule> = (0..b as u32).map(|r| RowRule { row: r, ..rule }).collect();
            let batch = SampleBatch { rules: &rs, adjust: &[], masks: &[], words: 0 };
            let ms = median_ms(dev, reps, || {
                sample(&logits, &batch)?;
                Ok(())
            })?;
            println!("| {} | {name} | {ms:.3} | {copy:.3} |", if peaked { "peaked" } else { "flat" });
        }
    }
    Ok(())
}

/// Random mixer inputs for `rows` tokens on `dev`: q, k unit rows, β ∈ (0, 1), g ≤ 0.
fn inputs(dev: &Device, rows: usize, h: usize, k: usize, v: usize) -> anyhow::Result<[Tensor; 5]> {
    let unit = |t: Tensor| -> anyhow::Result<Tensor> { Ok(t.broadcast_div(&t.sqr()?.sum_keepdim(2)?.sqrt()?)?) };
    let q = unit(Tensor::randn(0f32, 1.0, (rows, h, k), dev)?)?;
    let kk = unit(Tensor::randn(0f32, 1.0, (rows, h, k), dev)?)?;
    let vv = Tensor::randn(0f32, 1.0, (rows, h, v), dev)?;
    let beta = candle_core::Tensor::rand(0.05f32, 1.0, (rows, h), dev)?;
    let g = (candle_core::Tensor::rand(0f32, 1.0, (rows, h), dev)? * -0.1)?;
    Ok([q, kk, vv, beta, g])
}

fn prefill_table(dev: &Device, reps: usize, fla: &FlaTimes) -> anyhow::Result<()> {
    println!("\n## Prefill mixer (chunked, {reps} reps, median of CUDA-event times; fla = chunk_gated_delta_rule in this run)\n");
    println!("Both on the tensor cores: bf16 q/k/v as fla's inputs; f32 q/k/v split into bf16 hi + lo (the engine's path).");
    println!("Timed as do_bench times fla (L2 evicted, GPU busy before each call); the idle column starts each call on an idle GPU.\n");
    println!("| B | T | H | K | V | bf16 ms | tokens/s | fla ms | vs fla | bf16 ms, GPU idle | f32 ms |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    // The last two: the random 1.39B's heads (fla's 1.3B layout: 6 heads, K = 256, V = 512).
    let shapes = [
        (1, 4096, 16, 128, 256),
        (8, 2048, 16, 128, 256),
        (8, 2048, 16, 64, 256),
        (4, 8192, 16, 128, 256),
        (1, 4096, 6, 256, 512),
        (8, 2048, 6, 256, 512),
    ];
    let mut k_times = Vec::new();
    for (b, t, h, k, v) in shapes {
        let fla_ms = fla.prefill_ms((b, t, h, k, v));
        let [q, kk, vv, beta, g] = inputs(dev, b * t, h, k, v)?;
        let mut states = SlotBuffer::zeros_on(b, h * k * v, dev)?;
        let cu: Vec<usize> = (0..=b).map(|i| i * t).collect();
        let slots: Vec<usize> = (0..b).collect();
        let mut time = |dtype: DType, timing: Timing| -> anyhow::Result<f64> {
            let (q, kk, vv) = (q.to_dtype(dtype)?, kk.to_dtype(dtype)?, vv.to_dtype(dtype)?);
            let x = MixerInputs { q: &q, k: &kk, v: &vv, beta: &beta, g: Some(&g), n: 1, scale: (k as f32).powf(-0.5) };
            median_gpu_ms(dev, reps, timing, || {
                gated_delta_prefill_packed(x, &mut states, &cu, &slots, PrefillAlgo::Chunked, &[], None)?;
                Ok(())
            })
        };
        let (ms, idle) = (time(DType::BF16, Timing::DoBench)?, time(DType::BF16, Timing::IdleGpu)?);
        let ms32 = time(DType::F32, Timing::DoBench)?;
        let tps = (b * t) as f64 / ms * 1e3;
        println!(
            "| {b} | {t} | {h} | {k} | {v} | {ms:.3} | {:.2} M | {} | {}× | {idle:.3} | {ms32:.2} |",
            tps / 1e6,
            or_dash(fla_ms, 3),
            or_dash(fla_ms.map(|f| f / ms), 2)
        );
        if b == 8 && t == 2048 && h == 16 {
            k_times.push((k, ms));
        }
    }
    if let [(128, a), (64, b)] = k_times[..] {
        let fla_ratio = fla.prefill_ms((8, 2048, 16, 128, 256)).zip(fla.prefill_ms((8, 2048, 16, 64, 256))).map(|(x, y)| x / y);
        println!("\nK=64 (pruned) vs K=128 at B=8, T=2048: {:.2}× faster (fla: {}×)", a / b, or_dash(fla_ratio, 2));
    }
    Ok(())
}

fn decode_table(dev: &Device, reps: usize, fla: &FlaTimes) -> anyhow::Result<()> {
    println!("\n## Decode mixer step (H=16, K=128, V=256; one token per slot; {reps} reps, median of CUDA-event times)\n");
    println!("Timed as do_bench times fla (L2 evicted, GPU busy before each call); the idle columns start each call on an idle GPU,");
    println!("so they count the host's time to issue the launch as well.\n");
    println!("| B | µs per step | state traffic GB/s | % of copy bandwidth | µs, GPU idle | %, GPU idle | fla µs | fla GB/s |");
    println!("|---|---|---|---|---|---|---|---|");
    let (h, k, v) = (16, 128, 256);
    for b in [1usize, 8, 64, 256] {
        let fla_ms = fla.decode_ms(b);
        let [q, kk, vv, beta, g] = inputs(dev, b, h, k, v)?;
        let x = MixerInputs { q: &q, k: &kk, v: &vv, beta: &beta, g: Some(&g), n: 1, scale: (k as f32).powf(-0.5) };
        // Slots spread over a larger pool, in a shuffled order, as in serving.
        let pool = (2 * b).max(8);
        let mut states = SlotBuffer::zeros_on(pool, h * k * v, dev)?;
        let slots: Vec<usize> = (0..b).map(|i| (i * 7 + 3) % pool).collect();
        let mut uniq = slots.clone();
        uniq.sort_unstable();
        uniq.dedup();
        let slots = if uniq.len() == b { slots } else { (0..b).collect() };
        let mut time = |timing| {
            median_gpu_ms(dev, reps, timing, || {
                gated_delta_step(x, &mut states, &slots)?;
                Ok(())
            })
        };
        let (ms, idle) = (time(Timing::DoBench)?, time(Timing::IdleGpu)?);
        let bytes = (b * h * k * v * 4 * 2) as f64;
        let copy = copy_bw(dev)?;
        let pct = |ms: f64| 100.0 * bytes / (ms * 1e-3) / copy;
        let bw = bytes / (ms * 1e-3) / 1e9;
        println!(
            "| {b} | {:.1} | {bw:.0} | {:.0}% | {:.1} | {:.0}% | {} | {} |",
            ms * 1e3,
            pct(ms),
            idle * 1e3,
            pct(idle),
            or_dash(fla_ms.map(|f| f * 1e3), 1),
            or_dash(fla_ms.map(|f| bytes / (f * 1e-3) / 1e9), 0)
        );
    }
    Ok(())
}

/// A decode step's MLP down projection at the 1.3B shape (I=5632 → D=2048, bf16) for small
/// batches: the SwiGLU kernel then the small-batch projection, against the one kernel that
/// forms SwiGLU as it streams the weight (which the engine uses up to
/// `SWIGLU_LINEAR_MAX_ROWS` rows).
#[cfg(feature = "cuda")]
fn mlp_table(dev: &Device, reps: usize) -> anyhow::Result<()> {
    use deltaserve_kernels::cuda::{gemv, gemv_swiglu};
    use deltaserve_kernels::ops::swiglu;
    println!("\n## Decode MLP down projection (I=5632 -> D=2048, bf16; {reps} reps, median of CUDA-event times, do_bench method)\n");
    println!("| B | SwiGLU + projection µs | weight GB/s | fused µs | weight GB/s | fused speed-up |");
    println!("|---|---|---|---|---|---|");
    let (i, d) = (5632usize, 2048usize);
    let w = Tensor::randn(0f32, 0.02, (d, i), dev)?.to_dtype(DType::BF16)?;
    let gbs = |ms: f64| (d * i * 2) as f64 / (ms * 1e-3) / 1e9;
    for b in [1usize, 2, 4, 8] {
        let gu = Tensor::randn(0f32, 1.0, (b, 2 * i), dev)?.to_dtype(DType::BF16)?;
        let (gate, up) = (gu.narrow(1, 0, i)?, gu.narrow(1, i, i)?);
        let apart = median_gpu_ms(dev, reps, Timing::DoBench, || {
            let h = swiglu(&gate, &up)?;
            gemv(&h, &w)?.ok_or_else(|| anyhow::anyhow!("small-batch projection declined"))?;
            Ok(())
        })?;
        let fused = median_gpu_ms(dev, reps, Timing::DoBench, || {
            gemv_swiglu(&gate, &up, &w)?.ok_or_else(|| anyhow::anyhow!("fused projection declined"))?;
            Ok(())
        })?;
        println!("| {b} | {:.1} | {:.0} | {:.1} | {:.0} | {:.2}x |", apart * 1e3, gbs(apart), fused * 1e3, gbs(fused), apart / fused);
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn mlp_table(_dev: &Device, _reps: usize) -> anyhow::Result<()> {
    Ok(())
}

/// A decode step's norms folded into the projection after them (gemv_staged.cu) against the
/// norm kernel then the small-batch projection, at B = 1..8: the block seam (residual add +
/// RMSNorm) into the 1.39B model's input projection and Qwen3.5-2B's, and the gated output norm
/// into `o_proj` at both models' head shapes (bf16).
#[cfg(feature = "cuda")]
fn norm_table(dev: &Device, reps: usize) -> anyhow::Result<()> {
    use deltaserve_kernels::cuda::{add_norm_gemv, gated_norm_gemv, gemv};
    use deltaserve_kernels::ops::{add_rms_norm, gated_rms_norm};
    use deltaserve_kernels::GateActivation;
    println!("\n## Decode norms folded into the next projection (bf16; {reps} reps, median of CUDA-event times, do_bench method)\n");
    println!("| what | N x K | B | norm + projection µs | fused µs | fused speed-up |");
    println!("|---|---|---|---|---|---|");
    let declined = || anyhow::anyhow!("kernel declined the input");
    for (what, n, k) in [("add + RMSNorm -> in_proj, 1.39B", 9228usize, 2048usize), ("add + RMSNorm -> in_proj, Qwen3.5-2B", 12352, 2048)] {
        let w = Tensor::randn(0f32, 0.02, (n, k), dev)?.to_dtype(DType::BF16)?;
        let nw = Tensor::ones(k, DType::F32, dev)?;
        for b in 1..=8usize {
            let h = Tensor::randn(0f32, 1.0, (b, k), dev)?;
            let d = Tensor::randn(0f32, 1.0, (b, k), dev)?.to_dtype(DType::BF16)?;
            let apart = median_gpu_ms(dev, reps, Timing::DoBench, || {
                let (_, x) = add_rms_norm(&h, Some(&d), &nw, 1e-6, DType::BF16)?;
                gemv(&x, &w)?.ok_or_else(declined)?;
                Ok(())
            })?;
            let fused = median_gpu_ms(dev, reps, Timing::DoBench, || {
                add_norm_gemv(&h, Some(&d), &nw, 1e-6, &w)?.ok_or_else(declined)?;
                Ok(())
            })?;
            println!("| {what} | {n} x {k} | {b} | {:.1} | {:.1} | {:.2}x |", apart * 1e3, fused * 1e3, apart / fused);
        }
    }
    for (what, heads, vd) in [("gated norm -> o_proj, 1.39B", 6usize, 512usize), ("gated norm -> o_proj, Qwen3.5-2B", 32, 128)] {
        let (n, k) = (2048usize, heads * vd);
        let w = Tensor::randn(0f32, 0.02, (n, k), dev)?.to_dtype(DType::BF16)?;
        let nw = Tensor::ones(vd, DType::F32, dev)?;
        for b in 1..=8usize {
            let o = Tensor::randn(0f32, 1.0, (b, heads, vd), dev)?;
            let z = Tensor::randn(0f32, 1.0, (b, k), dev)?.to_dtype(DType::BF16)?;
            let apart = median_gpu_ms(dev, reps, Timing::DoBench, || {
                let x = gated_rms_norm(&o, Some(&z), &nw, 1e-6, GateActivation::Swish, DType::BF16)?.reshape((b, k))?;
                gemv(&x, &w)?.ok_or_else(declined)?;
                Ok(())
            })?;
            let fused = median_gpu_ms(dev, reps, Timing::DoBench, || {
                gated_norm_gemv(&o, Some(&z), &nw, 1e-6, false, &w)?.ok_or_else(declined)?;
                Ok(())
            })?;
            println!("| {what} | {n} x {k} | {b} | {:.1} | {:.1} | {:.2}x |", apart * 1e3, fused * 1e3, apart / fused);
        }
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn norm_table(_dev: &Device, _reps: usize) -> anyhow::Result<()> {
    Ok(())
}

/// The paged-attention op alone at Qwen3.5's attention shape, CUDA-event times.
#[cfg(feature = "cuda")]
fn attention_table(dev: &Device, reps: usize) -> anyhow::Result<()> {
    use deltaserve_kernels::ops::{paged_attention, AttentionShape, AttnOutput, DevicePages, Paged, PagedSeq, RopeArgs};
    let (hq, hkv, hd, bs) = (8usize, 2usize, 256usize, 16usize);
    let shape = AttentionShape { q_heads: hq, kv_heads: hkv, head_dim: hd, window: None, scale: 1.0 / 16.0, operands: DType::BF16 };
    let inv: Vec<f32> = (0..32).map(|i| 1.0 / 1e7f32.powf(i as f32 / 32.0)).collect();
    let inv = Tensor::new(inv.as_slice(), dev)?;
    let rope = Some(RopeArgs { inv_freq: &inv, rotary_dim: 64 });
    // (sequences, context, new rows each): prefills of one prompt, of four packed and of one long
    // one, then decode steps.
    let shapes =
        [(1usize, 4096usize, 4096usize), (4, 2048, 2048), (1, 16384, 16384), (1, 256, 1), (64, 256, 1), (1, 4096, 1), (64, 4096, 1)];
    for (b, ctx, rows) in shapes {
        let width = ctx.div_ceil(bs);
        // A bf16 model's cache is bf16 on the GPU.
        let mut kc = SlotBuffer::zeros_on_as(b * width, bs * hkv * hd, dev, DType::BF16)?;
        let mut vc = SlotBuffer::zeros_on_as(b * width, bs * hkv * hd, dev, DType::BF16)?;
        let tables: Vec<Vec<u32>> = (0..b).map(|s| (0..width).map(|j| (s * width + j) as u32).collect()).collect();
        let flat: Vec<i32> = tables.iter().flatten().map(|&x| x as i32).collect();
        let dev_tables = Tensor::new(flat.as_slice(), dev)?;
        let start = ctx - rows;
        let seqs: Vec<PagedSeq<'_>> = (0..b).map(|s| PagedSeq { start, slot: s, table: &tables[s] }).collect();
        let cu: Vec<usize> = (0..=b).map(|s| s * rows).collect();
        let n = b * rows;
        let row_slot: Vec<i32> = (0..n).map(|r| (r / rows) as i32).collect();
        let row_pos: Vec<i32> = (0..n).map(|r| (start + r % rows) as i32).collect();
        let (rs, rp) = (Tensor::new(row_slot.as_slice(), dev)?, Tensor::new(row_pos.as_slice(), dev)?);
        let q = Tensor::randn(0f32, 1.0, (n, hq, hd), dev)?;
        let k = Tensor::randn(0f32, 1.0, (n, hkv, hd), dev)?;
        let v = Tensor::randn(0f32, 1.0, (n, hkv, hd), dev)?;
        let pages = DevicePages { tables: &dev_tables, width, row_slot: &rs, row_pos: &rp, tiles: None };
        let ms = median_gpu_ms(dev, reps, Timing::IdleGpu, || {
            let pass = Paged { seqs: &seqs, cu: &cu, block_size: bs };
            let out = AttnOutput { dtype: DType::BF16, gate: None };
            paged_attention((&q, &k, &v), None, &shape, rope, pass, Some(pages), (&mut kc, &mut vc), out)?;
            Ok(())
        })?;
        // Causal flops of the new rows (QKᵀ and PV), and the cache bytes a decode step reads.
        let pairs: f64 = (0..rows).map(|i| (start + i + 1) as f64).sum::<f64>() * b as f64;
        let tflops = 4.0 * pairs * (hq * hd) as f64 / (ms * 1e-3) / 1e12;
        let gbs = (b * ctx * hkv * hd * 2 * 2) as f64 / (ms * 1e-3) / 1e9;
        println!(
            "OURS {}",
            serde_json::json!({"what": "attention", "batch": b, "context": ctx, "rows": rows, "ms": ms, "tflops": tflops, "cache_gb_s": gbs})
        );
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !cfg!(feature = "cuda") {
        println!("gpu_bench: built without `--features cuda`; nothing to time");
        return Ok(());
    }
    let dev = deltaserve_engine::parse_device("cuda")?;
    let fla = match &args.fla_json {
        Some(p) => FlaTimes::load(p)?,
        None => {
            println!("(no --fla-json: the mixer tables print no fla column; benches/mixer_vs_fla.sh times fla in the same run)");
            FlaTimes::default()
        }
    };
    #[cfg(feature = "cuda")]
    if args.gemm_only {
        return gemm::gemm_table(&dev);
    }
    #[cfg(feature = "cuda")]
    if args.gemm_algos {
        return gemm::algo_table(&dev, &args.gemm_algos_rows);
    }
    #[cfg(feature = "cuda")]
    if args.skinny {
        return gemm::skinny_table(&dev);
    }
    #[cfg(feature = "cuda")]
    if args.new_shapes {
        return gemm::new_shape_table(&dev);
    }
    #[cfg(feature = "cuda")]
    if args.attention_only {
        return attention_table(&dev, args.reps);
    }
    #[cfg(feature = "cuda")]
    if let Some(dir) = &args.hybrid_dir {
        let profile =
            model::HybridProfile { all: args.profile_hybrid, prefill: args.profile_hybrid_prefill, decode: args.profile_hybrid_decode };
        return model::hybrid_table(&dev, dir, &args, profile);
    }
    if args.decode_only {
        return decode_table(&dev, args.reps, &fla);
    }
    if args.prefill_mixer_only {
        return prefill_table(&dev, args.reps, &fla);
    }
    if args.sampling_only {
        return sampling_table(&dev, args.reps);
    }
    if args.mlp_only {
        mlp_table(&dev, args.reps)?;
        return norm_table(&dev, args.reps);
    }
    if args.profile_prefill
        || args.profile_decode.is_some()
        || args.model_only
        || args.small_prefill
        || args.host_cost
        || args.prefill_graphs
        || args.mixed_passes
    {
        return model::model_table(&dev, &args);
    }
    prefill_table(&dev, args.reps, &fla)?;
    decode_table(&dev, args.reps, &fla)?;
    mlp_table(&dev, args.reps)?;
    norm_table(&dev, args.reps)?;
    if !args.skip_model {
        model::model_table(&dev, &args)?;
    }
    Ok(())
}

//! The prefill's projections as GEMMs: candle's cuBLAS call (what `ops::linear` runs for more
//! rows than the GEMV kernels take) against cublasLt with its heuristic's first choice, at the 1.39B model's
//! four projection shapes and a prefill pass's row counts. `benches/gemm_torch.py` times
//! PyTorch's `F.linear` on the same shapes in the same GPU call.

use candle_core::{DType, Device, Tensor};

/// The model's projections `(name, N, K)`: `x [M, K] · W[N, K]ᵀ`.
const SHAPES: [(&str, usize, usize); 4] =
    [("in_proj", 9228, 2048), ("o_proj", 2048, 3072), ("gate_up", 11264, 2048), ("down_proj", 2048, 5632)];
/// Rows of a pass.
const ROWS: [usize; 5] = [64, 256, 512, 2048, 4096];

/// Mean GPU µs of `f` over `calls` back-to-back calls between two CUDA events, after warm-up.
fn mean_event_us(cuda: &candle_core::CudaDevice, calls: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
    for _ in 0..5 {
        f()?;
    }
    let stream = cuda.cuda_stream();
    stream.synchronize()?;
    let start = stream.record_event(Some(CU_EVENT_DEFAULT))?;
    for _ in 0..calls {
        f()?;
    }
    let end = stream.record_event(Some(CU_EVENT_DEFAULT))?;
    Ok(start.elapsed_ms(&end)? as f64 * 1e3 / calls as f64)
}

/// cudarc's cublasLt call (its heuristic asked each call) for bf16 row-major `out [m, n] = x [m,
/// k] · w [n, k]ᵀ`, both contiguous: column-major `outᵀ = op(w buffer)ᵀ · x buffer`.
fn lt_call(
    lt: &candle_core::cuda_backend::cudarc::cublaslt::CudaBlasLT,
    w: &Tensor,
    x: &Tensor,
    out: &mut candle_core::cuda_backend::cudarc::driver::CudaSlice<half::bf16>,
) -> anyhow::Result<()> {
    use candle_core::cuda_backend::cudarc::cublaslt::Matmul;
    let ((m, k), n) = (x.dims2()?, w.dim(0)?);
    let (ws, xs) = (w.storage_and_layout(), x.storage_and_layout());
    let (candle_core::Storage::Cuda(wc), candle_core::Storage::Cuda(xc)) = (&*ws.0, &*xs.0) else { anyhow::bail!("CUDA storage expected") };
    let (wv, xv) = (wc.as_cuda_slice::<half::bf16>()?, xc.as_cuda_slice::<half::bf16>()?);
    // SAFETY: the buffers hold n·k, m·k and m·n elements as the config says.
    unsafe { lt.matmul(lt_config(m, n, k), wv, xv, out, None, None) }?;
    Ok(())
}

fn lt_config(m: usize, n: usize, k: usize) -> candle_core::cuda_backend::cudarc::cublaslt::MatmulConfig {
    candle_core::cuda_backend::cudarc::cublaslt::MatmulConfig {
        transa: true,
        transb: false,
        transc: false,
        m: n as u64,
        n: m as u64,
        k: k as u64,
        alpha: 1.0,
        lda: k as i64,
        ldb: k as i64,
        beta: 0.0,
        ldc: n as i64,
        stride_a: None,
        stride_b: None,
        stride_c: None,
        stride_bias: None,
        batch_size: None,
    }
}

/// One `GEMM {json}` line per shape, row count and path (µs and TFLOP/s).
pub(super) fn gemm_table(dev: &Device) -> anyhow::Result<()> {
    use candle_core::cuda_backend::cudarc::cublaslt::CudaBlasLT;
    let Device::Cuda(cuda) = dev else { anyhow::bail!("gemm_table needs a CUDA device") };
    let stream = cuda.cuda_stream();
    let lt = CudaBlasLT::new(stream.clone())?;
    for (name, n, k) in SHAPES {
        let w = Tensor::randn(0f32, 0.02, (n, k), dev)?.to_dtype(DType::BF16)?;
        for m in ROWS {
            let x = Tensor::randn(0f32, 1.0, (m, k), dev)?.to_dtype(DType::BF16)?;
            let flop = 2.0 * (m * n * k) as f64;
            let candle = mean_event_us(cuda, 50, || super::passes::done(deltaserve_kernels::ops::linear(&x, &w)))?;
            let mut out = unsafe { stream.alloc::<half::bf16>(m * n) }?;
            let lt_us = mean_event_us(cuda, 50, || lt_call(&lt, &w, &x, &mut out))?;
            for (path, us) in [("candle cuBLAS", candle), ("cublasLt", lt_us)] {
                let line = serde_json::json!({"name": name, "m": m, "n": n, "k": k, "path": path, "us": us, "tflops": flop / us / 1e6});
                println!("GEMM {line}");
            }
        }
    }
    Ok(())
}

/// Host milliseconds of the first GEMM at a row count the process has not run before, against
/// the same call repeated: what a prefill pass of a new length pays on its first layer. Rows
/// of no alignment and multiples of 64, through `ops::linear` (candle's cuBLAS call) and
/// cudarc's cublasLt call (its heuristic asked each call).
pub(super) fn new_shape_table(dev: &Device) -> anyhow::Result<()> {
    use candle_core::cuda_backend::cudarc::cublaslt::CudaBlasLT;
    let Device::Cuda(cuda) = dev else { anyhow::bail!("new_shape_table needs a CUDA device") };
    let stream = cuda.cuda_stream();
    let lt = CudaBlasLT::new(stream.clone())?;
    let (n, k) = (9280usize, 2048usize);
    let w = Tensor::randn(0f32, 0.02, (n, k), dev)?.to_dtype(DType::BF16)?;
    let big = Tensor::randn(0f32, 1.0, (1024, k), dev)?.to_dtype(DType::BF16)?;
    let timed = |f: &mut dyn FnMut() -> anyhow::Result<()>| -> anyhow::Result<f64> {
        dev.synchronize()?;
        let t0 = std::time::Instant::now();
        f()?;
        dev.synchronize()?;
        Ok(t0.elapsed().as_secs_f64() * 1e3)
    };
    println!("| path | M | first call ms | repeated ms |");
    println!("|---|---|---|---|");
    for m in [201usize, 219, 237, 255, 266, 281, 640, 704, 768, 832] {
        let x = big.narrow(0, 0, m)?.contiguous()?;
        let mut f = || super::passes::done(deltaserve_kernels::ops::linear(&x, &w));
        let (a, b) = (timed(&mut f)?, timed(&mut f)?);
        println!("| ops::linear | {m} | {a:.3} | {b:.3} |");
    }
    // Each model projection at row counts of the 128 and 192 buckets, in order: the first call
    // at a row count against the same call repeated.
    println!("\n| projection | M | first call ms | repeated ms | cublasLt (ran, handed back) |");
    println!("|---|---|---|---|---|");
    for (name, n, k) in SHAPES {
        let w = Tensor::randn(0f32, 0.02, (n, k), dev)?.to_dtype(DType::BF16)?;
        let wide = Tensor::randn(0f32, 1.0, (160, k), dev)?.to_dtype(DType::BF16)?;
        for m in [67usize, 79, 94, 101, 117, 128, 133, 150] {
            let x = wide.narrow(0, 0, m)?.contiguous()?;
            let mut f = || super::passes::done(deltaserve_kernels::ops::linear(&x, &w));
            let (a, b) = (timed(&mut f)?, timed(&mut f)?);
            println!("| {name} | {m} | {a:.3} | {b:.3} | {:?} |", deltaserve_kernels::cuda::linear_lt_counts());
        }
    }
    println!();
    for m in [301usize, 319, 337, 896, 960] {
        let x = big.narrow(0, 0, m)?.contiguous()?;
        let mut out = unsafe { stream.alloc::<half::bf16>(m * n) }?;
        let mut f = || lt_call(&lt, &w, &x, &mut out);
        let (a, b) = (timed(&mut f)?, timed(&mut f)?);
        println!("| cublasLt (heuristic each call) | {m} | {a:.3} | {b:.3} |");
    }
    Ok(())
}

/// The decode step's cublasLt projections `(model, name, N, K)`.
const DECODE_SHAPES: [(&str, &str, usize, usize); 10] = [
    ("1.39B", "in_proj", 9280, 2048),
    ("1.39B", "o_proj", 2048, 3072),
    ("1.39B", "gate_up", 11264, 2048),
    ("1.39B", "down_proj", 2048, 5632),
    ("Qwen3.5", "gdn in_proj", 12352, 2048),
    ("Qwen3.5", "gdn out_proj", 2048, 4096),
    ("Qwen3.5", "attn qkv", 5120, 2048),
    ("Qwen3.5", "attn o_proj", 2048, 2048),
    ("Qwen3.5", "gate_up", 12288, 2048),
    ("Qwen3.5", "down_proj", 2048, 6144),
];

/// One `ALGO {json}` line per decode shape, row count, output variant and algorithm the
/// heuristic offers (`linear_lt_pick`): µs a GEMM and W's TB/s, timed as CUDA graphs of 24 GEMMs
/// over copies of W that overflow L2 (so W streams from memory, as in a decode step). The
/// 2,048-row projections (split-K at these rows) are also tried with an f32 output and with
/// their split-K reduced in place (no reduce launch).
/// With `rows` given, those row counts instead, the default variant only, 16 algorithms each.
/// Each line also counts the elements whose bits differ from the first algorithm's product.
pub(super) fn algo_table(dev: &Device, rows: &[usize]) -> anyhow::Result<()> {
    use deltaserve_kernels::cuda::{graph, linear_lt_pick, LtVariant};
    let Device::Cuda(cuda) = dev else { anyhow::bail!("algo_table needs a CUDA device") };
    const CALLS: usize = 24;
    // cublasLtReductionScheme_t: INPLACE 1, COMPUTE_TYPE 2, OUTPUT_TYPE 4.
    let variants = [
        ("bf16", LtVariant::default()),
        ("f32", LtVariant { out_f32: true, reduction_mask: None }),
        ("f32 inplace", LtVariant { out_f32: true, reduction_mask: Some(1) }),
        ("bf16 inplace", LtVariant { out_f32: false, reduction_mask: Some(1) }),
    ];
    for (model, name, n, k) in DECODE_SHAPES {
        let bytes = n * k * 2;
        let copies = (256usize << 20).div_ceil(bytes).max(2);
        let ws = (0..copies)
            .map(|_| Tensor::randn(0f32, 0.02, (n, k), dev).and_then(|w| w.to_dtype(DType::BF16)))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let prefill = !rows.is_empty();
        let ms = if prefill { rows.to_vec() } else { vec![16, 64] };
        for m in ms {
            let x = Tensor::randn(0f32, 1.0, (m, k), dev)?.to_dtype(DType::BF16)?;
            for (label, variant) in variants {
                if variant != LtVariant::default() && (n != 2048 || prefill) {
                    continue;
                }
                // The default algorithm's product, against which each pick's bits are compared.
                let mut first: Option<Tensor> = None;
                for pick in 0..if prefill { 16 } else { 8 } {
                    let Some((y, config)) = linear_lt_pick(&x, &ws[0], pick, variant)? else { break };
                    let differing = match &first {
                        None => {
                            first = Some(y);
                            0
                        }
                        Some(y0) => (m * n) as u64 - y.eq(y0)?.to_dtype(DType::U32)?.sum_all()?.to_scalar::<u32>()? as u64,
                    };
                    let g = graph::capture(cuda, || -> anyhow::Result<()> {
                        for i in 0..CALLS {
                            linear_lt_pick(&x, &ws[i % copies], pick, variant)?;
                        }
                        Ok(())
                    })?;
                    let Some(g) = g else { continue };
                    let us = super::timing::median_gpu_ms(dev, 9, super::timing::Timing::IdleGpu, || Ok(g.launch()?))? * 1e3 / CALLS as f64;
                    let tflops = 2.0 * (m * n * k) as f64 / us / 1e6;
                    let line = serde_json::json!({"model": model, "name": name, "m": m, "n": n, "k": k, "variant": label, "pick": pick, "algo": config, "us": us, "tbs": bytes as f64 / us / 1e6, "tflops": tflops, "differing": differing});
                    println!("ALGO {line}");
                }
            }
            if n == 2048 && !prefill {
                // The split as unsummed f32 slices (`linear_lt_parts`: no reduce launch; the
                // residual norm sums them): the GEMM alone, at the default split and forced ones.
                for forced in [None, Some(2), Some(4), Some(8)] {
                    deltaserve_kernels::cuda::set_split_parts(forced);
                    let Some(p) = deltaserve_kernels::cuda::linear_lt_parts(&x, &ws[0])? else { continue };
                    let g = graph::capture(cuda, || -> anyhow::Result<()> {
                        for i in 0..CALLS {
                            deltaserve_kernels::cuda::linear_lt_parts(&x, &ws[i % copies])?;
                        }
                        Ok(())
                    })?;
                    let Some(g) = g else { continue };
                    let us = super::timing::median_gpu_ms(dev, 9, super::timing::Timing::IdleGpu, || Ok(g.launch()?))? * 1e3 / CALLS as f64;
                    let label = format!("parts {} ({})", p.dim(0)?, forced.map_or("default".to_string(), |f| format!("asked {f}")));
                    let line = serde_json::json!({"model": model, "name": name, "m": m, "n": n, "k": k, "variant": label, "pick": 0, "algo": "", "us": us, "tbs": bytes as f64 / us / 1e6});
                    println!("ALGO {line}");
                }
                deltaserve_kernels::cuda::set_split_parts(None);
            }
        }
    }
    Ok(())
}

/// One `SKINNY {json}` line per decode shape (and the LM heads), row count and path: cuBLAS as
/// the engine ran it before the skinny GEMM (`linear_lt`; the 2,048-row projections as
/// unsummed split-K slices, `linear_lt_parts`; the heads with f32 output) against the skinny
/// GEMM in the shape it picks and in other shapes, µs a GEMM and W's TB/s, timed as CUDA graphs
/// of 24 GEMMs over copies of W that overflow L2, as [`algo_table`] times cuBLAS's algorithms.
pub(super) fn skinny_table(dev: &Device) -> anyhow::Result<()> {
    use deltaserve_kernels::cuda::{graph, linear_lt, linear_lt_f32, linear_lt_parts, skinny_gemm, SkinnyConfig, SkinnyOut};
    let Device::Cuda(cuda) = dev else { anyhow::bail!("skinny_table needs a CUDA device") };
    const CALLS: usize = 24;
    let sms = {
        use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as SM;
        cuda.cuda_stream().context().attribute(SM)? as usize
    };
    let heads = [("1.39B", "lm_head", 32000usize, 2048usize), ("Qwen3.5", "lm_head", 248320, 2048)];
    for (model, name, n, k) in DECODE_SHAPES.into_iter().chain(heads) {
        let head = name == "lm_head";
        let bytes = n * k * 2;
        let copies = (256usize << 20).div_ceil(bytes).max(2);
        let ws = (0..copies)
            .map(|_| Tensor::randn(0f32, 0.02, (n, k), dev).and_then(|w| w.to_dtype(DType::BF16)))
            .collect::<candle_core::Result<Vec<_>>>()?;
        for m in [4usize, 8, 16, 32, 64] {
            let x = Tensor::randn(0f32, 1.0, (m, k), dev)?.to_dtype(DType::BF16)?;
            // (label, config, as slices)
            let narrow = n == 2048;
            let mut paths: Vec<(String, Option<SkinnyConfig>, bool)> = vec![("cuBLAS".into(), None, false)];
            if let Some(c) = SkinnyConfig::choose(m, n, k, sms, narrow) {
                paths.push((format!("skinny auto {}{}", c.name(), if narrow { " parts" } else { "" }), Some(c), narrow));
            }
            if [4, 16, 64].contains(&m) {
                for warpgroups in [1, 2] {
                    for splits in [1, 2, 4, 8] {
                        for stages in [4, 6, 8] {
                            let c = SkinnyConfig { warpgroups, splits, stages, evict_first: false };
                            let fits = stages * (64 * warpgroups + 64) * 128 <= 200 * 1024;
                            let wanted = if narrow { splits >= 2 && stages <= 6 } else { splits <= 2 };
                            if c.takes(k) && fits && wanted {
                                paths.push((format!("skinny {}{}", c.name(), if narrow { " parts" } else { "" }), Some(c), narrow));
                            }
                        }
                    }
                }
                if narrow {
                    let c = SkinnyConfig { warpgroups: 1, splits: 8, stages: 4, evict_first: false };
                    paths.push((format!("skinny {} cluster", c.name()), Some(c), false));
                }
            }
            for (path, cfg, parts) in paths {
                let out = match (head, parts) {
                    (true, _) => SkinnyOut::F32,
                    (false, true) => SkinnyOut::Parts,
                    (false, false) => SkinnyOut::Rows,
                };
                let run = |w: &Tensor| -> anyhow::Result<bool> {
                    Ok(match cfg {
                        None if head => linear_lt_f32(&x, w)?.is_some(),
                        None if n == 2048 => linear_lt_parts(&x, w)?.is_some(),
                        None => linear_lt(&x, w)?.is_some(),
                        Some(c) => skinny_gemm(&x, w, out, Some(c))?.is_some(),
                    })
                };
                if !run(&ws[0])? {
                    continue;
                }
                let g = graph::capture(cuda, || -> anyhow::Result<()> {
                    for i in 0..CALLS {
                        run(&ws[i % copies])?;
                    }
                    Ok(())
                })?;
                let Some(g) = g else { continue };
                let us = super::timing::median_gpu_ms(dev, 9, super::timing::Timing::IdleGpu, || Ok(g.launch()?))? * 1e3 / CALLS as f64;
                let line = serde_json::json!({"model": model, "name": name, "m": m, "n": n, "k": k, "path": path, "us": us, "tbs": bytes as f64 / us / 1e6});
                println!("SKINNY {line}");
            }
        }
    }
    Ok(())
}

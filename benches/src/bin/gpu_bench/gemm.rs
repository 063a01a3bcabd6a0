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

/// One `GEMM {json}` line per shape, row count and path (µs and TFLOP/s).
pub(super) fn gemm_table(dev: &Device) -> anyhow::Result<()> {
    use candle_core::cuda_backend::cudarc::cublaslt::{CudaBlasLT, Matmul, MatmulConfig};
    let Device::Cuda(cuda) = dev else { anyhow::bail!("gemm_table needs a CUDA device") };
    let stream = cuda.cuda_stream();
    let lt = CudaBlasLT::new(stream.clone())?;
    for (name, n, k) in SHAPES {
        let w = Tensor::randn(0f32, 0.02, (n, k), dev)?.to_dtype(DType::BF16)?;
        for m in ROWS {
            let x = Tensor::randn(0f32, 1.0, (m, k), dev)?.to_dtype(DType::BF16)?;
            let flop = 2.0 * (m * n * k) as f64;
            let candle = mean_event_us(cuda, 50, || super::passes::done(deltaserve_kernels::ops::linear(&x, &w)))?;
            // Row-major C[m, n] = x · Wᵀ is column-major Cᵀ[n, m] = op(W buffer)ᵀ · x buffer.
            let cfg = MatmulConfig {
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
            };
            let mut out = unsafe { stream.alloc::<half::bf16>(m * n) }?;
            let (ws, xs) = (w.storage_and_layout(), x.storage_and_layout());
            let (candle_core::Storage::Cuda(wc), candle_core::Storage::Cuda(xc)) = (&*ws.0, &*xs.0) else {
                anyhow::bail!("CUDA storage expected")
            };
            let (wv, xv) = (wc.as_cuda_slice::<half::bf16>()?, xc.as_cuda_slice::<half::bf16>()?);
            let lt_us = mean_event_us(cuda, 50, || {
                // SAFETY: the buffers hold m·k, n·k and m·n elements as the config says.
                unsafe { lt.matmul(cfg, wv, xv, &mut out, None, None) }?;
                Ok(())
            })?;
            for (path, us) in [("candle cuBLAS", candle), ("cublasLt", lt_us)] {
                let line = serde_json::json!({"name": name, "m": m, "n": n, "k": k, "path": path, "us": us, "tflops": flop / us / 1e6});
                println!("GEMM {line}");
            }
        }
    }
    Ok(())
}

#!/usr/bin/env bash
# Sets up a CUDA 13.0 build toolchain from PyPI wheels (no GPU, no root needed), as
# ../shared/docs/cuda-build.md describes: nvcc 13.0.x with its crt/nvvm/cccl parts, cudart,
# and link-time stubs for the driver, cuBLAS, cuBLASLt, cuRAND and NVRTC (the real libraries
# come from the GPU host at run time).
#
# Pinned to 13.0.x: PTX from newer nvcc is rejected by a 13.0 driver
# (CUDA_ERROR_UNSUPPORTED_PTX_VERSION).
#
# Usage:  eval "$(scripts/cuda-toolchain.sh)"   # prints the exports for the build
#         cargo build --release -p deltaserve --features cuda
set -euo pipefail
CUDA_DIR=${DELTASERVE_CUDA_DIR:-$HOME/.cache/deltaserve/cuda-13.0.88}
CUDARC_VERSION=0.19.10

if [[ ! -x "$CUDA_DIR/bin/nvcc" || ! -f "$CUDA_DIR/lib/stubs/libcuda.so" ]]; then
  command -v pip >/dev/null || command -v pip3 >/dev/null || { echo "cuda-toolchain: pip is required" >&2; exit 1; }
  PIP=$(command -v pip || command -v pip3)
  # cudarc's sources provide the symbol lists for the stubs.
  cargo fetch --locked >&2
  CUDARC_SRC=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-$CUDARC_VERSION/src 2>/dev/null | head -1)
  [[ -n "$CUDARC_SRC" ]] || { echo "cuda-toolchain: cudarc $CUDARC_VERSION not in the cargo registry" >&2; exit 1; }
  WH=$(mktemp -d)
  trap 'rm -rf "$WH" "$CUDA_DIR.tmp"' EXIT
  "$PIP" download --no-deps --only-binary=:all: -d "$WH" -q \
    nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
    nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 >&2
  rm -rf "$CUDA_DIR.tmp"; mkdir -p "$CUDA_DIR.tmp"
  for w in "$WH"/*.whl; do unzip -q -o "$w" 'nvidia/cu13/*' -d "$CUDA_DIR.tmp"; done
  rm -rf "$CUDA_DIR"; mkdir -p "$(dirname "$CUDA_DIR")"
  mv "$CUDA_DIR.tmp/nvidia/cu13" "$CUDA_DIR"
  ln -sf libcudart.so.13 "$CUDA_DIR/lib/libcudart.so"
  mkdir -p "$CUDA_DIR/lib/stubs"
  # Link-time stubs with the real SONAMEs; the symbols are every binding cudarc declares.
  stub() {
    grep -oP '^pub unsafe fn \K\w+' "$CUDARC_SRC/$3" | sort -u | sed 's/.*/int &(void){return 999;}/' >"$CUDA_DIR/lib/stubs/$1.c"
    gcc -shared -fPIC -Wl,-soname,"$2" -o "$CUDA_DIR/lib/stubs/$1.so" "$CUDA_DIR/lib/stubs/$1.c"
  }
  stub libcuda libcuda.so.1 driver/sys/mod.rs
  stub libcublas libcublas.so.13 cublas/sys/mod.rs
  stub libcublasLt libcublasLt.so.13 cublaslt/sys/mod.rs
  stub libcurand libcurand.so.10 curand/sys/mod.rs
  stub libnvrtc libnvrtc.so.13 nvrtc/sys/mod.rs
  echo "cuda-toolchain: installed $("$CUDA_DIR/bin/nvcc" --version | grep release) in $CUDA_DIR" >&2
fi
# NCCL (the `nccl` feature, tensor parallelism): a link stub too; the GPU host's libnccl.so.2
# (e.g. PyTorch's nvidia-nccl wheel) is loaded at run time.
if [[ ! -f "$CUDA_DIR/lib/stubs/libnccl.so" ]]; then
  cargo fetch --locked >&2
  CUDARC_SRC=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-$CUDARC_VERSION/src 2>/dev/null | head -1)
  grep -oP '^pub unsafe fn \K\w+' "$CUDARC_SRC/nccl/sys/mod.rs" | sort -u | sed 's/.*/int &(void){return 999;}/' >"$CUDA_DIR/lib/stubs/libnccl.c"
  gcc -shared -fPIC -Wl,-soname,libnccl.so.2 -o "$CUDA_DIR/lib/stubs/libnccl.so" "$CUDA_DIR/lib/stubs/libnccl.c"
fi
# CUDAFORGE_THREADS: the build scripts that run nvcc (ours, candle-kernels') use every core, not
# cudaforge's default of half: candle-kernels' GGUF kernels, compiled to SASS one file after
# another, were the longest step of a 2-core CI build (about 8 minutes on one core).
echo "export PATH=$CUDA_DIR/bin:\$PATH CUDA_ROOT=$CUDA_DIR CUDA_HOME=$CUDA_DIR CUDA_COMPUTE_CAP=90 CUDARC_CUDA_VERSION=13000 CUDAFORGE_THREADS=$(nproc)"

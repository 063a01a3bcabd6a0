//! Compiles `cuda/*.cu` to PTX (sm_90a with CUDA_COMPUTE_CAP=90) when the `cuda` feature is on;
//! nothing otherwise, so CPU builds need no CUDA toolchain.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    #[cfg(feature = "cuda")]
    build_ptx();
}

#[cfg(feature = "cuda")]
fn build_ptx() {
    println!("cargo::rerun-if-changed=cuda");
    println!("cargo::rerun-if-env-changed=CUDA_COMPUTE_CAP");
    let out_dir = std::env::var("OUT_DIR").unwrap_or_else(|_| panic!("cargo sets OUT_DIR for build scripts"));
    let built = cudaforge::KernelBuilder::new()
        .source_dir("cuda")
        .watch(["cuda/common.cuh", "cuda/dtype.cuh", "cuda/tc_common.cuh", "cuda/gemv.cuh", "cuda/norm.cuh", "cuda/attention.cuh"])
        .arg("-O3")
        .arg("-lineinfo")
        .arg("-std=c++17")
        .arg("--expt-relaxed-constexpr")
        .build_ptx()
        .unwrap_or_else(|e| panic!("compiling kernels/cuda with nvcc failed (is scripts/cuda-toolchain.sh sourced?): {e}"));
    built.write(format!("{out_dir}/ptx.rs")).unwrap_or_else(|e| panic!("writing ptx.rs: {e}"));
}

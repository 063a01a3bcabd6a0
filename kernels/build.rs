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
        .watch([
            "cuda/common.cuh",
            "cuda/dtype.cuh",
            "cuda/tc_common.cuh",
            "cuda/gemv.cuh",
            "cuda/norm.cuh",
            "cuda/attention.cuh",
            "cuda/state_io.cuh",
            "cuda/chunk_mma.cuh",
        ])
        .arg("-O3")
        .arg("-lineinfo")
        .arg("-std=c++17")
        .arg("--expt-relaxed-constexpr")
        .build_ptx()
        .unwrap_or_else(|e| panic!("compiling kernels/cuda with nvcc failed (is scripts/cuda-toolchain.sh sourced?): {e}"));
    built.write(format!("{out_dir}/ptx.rs")).unwrap_or_else(|e| panic!("writing ptx.rs: {e}"));
    write_pdl_entries(&out_dir);
}

/// `pdl_entries.rs`: the PTX entries that wait on `griddepcontrol.wait` (common.cuh's
/// `pdl_entry`), which a rebuilt graph may launch programmatically (src/cuda/graph.rs). Listed
/// here so that the library does not carry a second copy of the PTX text to scan.
#[cfg(feature = "cuda")]
fn write_pdl_entries(out_dir: &str) {
    let mut names = Vec::new();
    let dir = std::fs::read_dir(out_dir).unwrap_or_else(|e| panic!("reading {out_dir}: {e}"));
    for entry in dir.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|x| x == "ptx") {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            for piece in text.split(".entry ").skip(1) {
                let name = piece.split('(').next().unwrap_or("").trim();
                // `piece` runs to the next entry: this entry's body.
                if !name.is_empty() && piece.contains("griddepcontrol.wait") {
                    names.push(name.to_string());
                }
            }
        }
    }
    names.sort();
    let list: String = names.iter().map(|n| format!("    {n:?},\n")).collect();
    let rs = format!("/// PTX entries that wait on their predecessors (build.rs).\npub const PDL_ENTRIES: &[&str] = &[\n{list}];\n");
    std::fs::write(format!("{out_dir}/pdl_entries.rs"), rs).unwrap_or_else(|e| panic!("writing pdl_entries.rs: {e}"));
}

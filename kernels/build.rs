//! Compiles `cuda/*.cu` to PTX (sm_90a with CUDA_COMPUTE_CAP=90) when the `cuda` feature is on,
//! then each PTX file to SASS for its target with `ptxas`, so that the library embeds machine
//! code and a process loads its modules without the driver's JIT (about 90 s on an H200 the
//! first time a machine starts the server, whose cache a fresh container does not have). A
//! target without an arch-specific suffix (`sm_80`, not `sm_90a`) keeps its PTX, which the
//! driver can compile for newer GPUs. Nothing without the feature, so CPU builds need no CUDA
//! toolchain.

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
    // Every header: a .cu file is recompiled when any of them changes (a list by hand once missed
    // chunk_wg_ws.cuh, so an edit to it alone left the old kernels in an incremental build).
    let mut headers: Vec<std::path::PathBuf> = std::fs::read_dir("cuda")
        .unwrap_or_else(|e| panic!("reading kernels/cuda: {e}"))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cuh"))
        .collect();
    headers.sort();
    let built = cudaforge::KernelBuilder::new()
        .source_dir("cuda")
        .watch(headers)
        .arg("-O3")
        .arg("-lineinfo")
        .arg("-std=c++17")
        .arg("--expt-relaxed-constexpr")
        .build_ptx()
        .unwrap_or_else(|e| panic!("compiling kernels/cuda with nvcc failed (is scripts/cuda-toolchain.sh sourced?): {e}"));
    built.write(format!("{out_dir}/ptx.rs")).unwrap_or_else(|e| panic!("writing ptx.rs: {e}"));
    write_pdl_entries(&out_dir);
    write_modules(&out_dir);
}

/// `modules.rs`: one `Module` const for each PTX file that `ptx.rs` lists (cudaforge's
/// `pub const NAME: &str = include_str!(concat!(env!("OUT_DIR"), "/file.ptx"));`), its image
/// SASS from `ptxas` where the target is arch-specific, its PTX otherwise. The SASS files are
/// compiled side by side and only when older than their PTX.
#[cfg(feature = "cuda")]
fn write_modules(out_dir: &str) {
    let listing = std::fs::read_to_string(format!("{out_dir}/ptx.rs")).unwrap_or_else(|e| panic!("reading ptx.rs: {e}"));
    let mut modules: Vec<(String, String)> = Vec::new();
    for line in listing.lines() {
        let name = line.strip_prefix("pub const ").and_then(|r| r.split(':').next());
        let file = line.split("\"/").nth(1).and_then(|r| r.strip_suffix(".ptx\"));"));
        if let (Some(name), Some(file)) = (name, file) {
            modules.push((name.trim().to_string(), file.to_string()));
        }
    }
    assert!(!modules.is_empty(), "no modules in {out_dir}/ptx.rs");
    // The target of each PTX file, from its `.target` line.
    let target = |file: &str| -> String {
        let text = std::fs::read_to_string(format!("{out_dir}/{file}.ptx")).unwrap_or_else(|e| panic!("reading {file}.ptx: {e}"));
        let line = text.lines().find(|l| l.starts_with(".target ")).unwrap_or_else(|| panic!("{file}.ptx has no .target"));
        line[".target ".len()..].split(',').next().unwrap_or("").trim().to_string()
    };
    let stale = |file: &str| {
        let modified = |ext: &str| std::fs::metadata(format!("{out_dir}/{file}.{ext}")).and_then(|m| m.modified()).ok();
        match (modified("ptx"), modified("cubin")) {
            (Some(ptx), Some(cubin)) => cubin < ptx,
            _ => true,
        }
    };
    let sass: Vec<bool> = std::thread::scope(|scope| {
        let jobs: Vec<_> = modules
            .iter()
            .map(|(_, file)| {
                let arch = target(file);
                scope.spawn(move || {
                    if !arch.ends_with('a') {
                        return false;
                    }
                    if stale(file) {
                        let status = std::process::Command::new("ptxas")
                            .args([
                                "-O3",
                                &format!("-arch={arch}"),
                                &format!("{out_dir}/{file}.ptx"),
                                "-o",
                                &format!("{out_dir}/{file}.cubin"),
                            ])
                            .status()
                            .unwrap_or_else(|e| panic!("running ptxas (is scripts/cuda-toolchain.sh sourced?): {e}"));
                        assert!(status.success(), "ptxas failed on {file}.ptx for {arch}");
                    }
                    true
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap_or_else(|_| panic!("a ptxas job panicked"))).collect()
    });
    let mut rs = String::from("// Written by build.rs: the kernel modules' images.\n");
    for ((name, file), sass) in modules.iter().zip(sass) {
        let image = if sass {
            format!("Image::Sass(include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{file}.cubin\")))")
        } else {
            format!("Image::Ptx(include_str!(concat!(env!(\"OUT_DIR\"), \"/{file}.ptx\")))")
        };
        rs.push_str(&format!("/// `cuda/{file}.cu`.\npub(crate) static {name}: Module = Module {{ name: {file:?}, image: {image} }};\n"));
    }
    std::fs::write(format!("{out_dir}/modules.rs"), rs).unwrap_or_else(|e| panic!("writing modules.rs: {e}"));
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

//! The kernel modules of `kernels/cuda/*.cu`, embedded by build.rs and loaded once per CUDA
//! context: SASS for the build's architecture, so that starting a process compiles nothing (the
//! driver's JIT of their PTX took about 90 s on an H200 whenever its cache was cold, as in
//! every fresh container), or PTX for a target without an arch-specific suffix.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule, CudaStream, LaunchArgs};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::WrapErr;
use candle_core::CudaDevice;

use crate::Result;

/// What build.rs embedded for a module.
pub(crate) enum Image {
    /// Machine code for the build's architecture (a cubin).
    Sass(&'static [u8]),
    /// PTX text, compiled by the driver at load (built only for targets without an
    /// arch-specific suffix).
    #[allow(dead_code)]
    Ptx(&'static str),
}

/// One of `kernels/cuda`'s modules.
pub(crate) struct Module {
    /// The source file's stem.
    name: &'static str,
    image: Image,
}

impl Module {
    /// Whether the module is machine code (a cubin for the build's arch-specific target, sm_90a):
    /// the only images whose warpgroup (wgmma) entries are built.
    pub(crate) fn is_sass(&self) -> bool {
        matches!(self.image, Image::Sass(_))
    }
}

include!(concat!(env!("OUT_DIR"), "/modules.rs"));

/// A function of one of the modules, launched on its device's stream.
pub(crate) struct Func {
    func: CudaFunction,
    stream: Arc<CudaStream>,
}

impl Func {
    /// A launch on the device's stream.
    pub(crate) fn builder(&self) -> LaunchArgs<'_> {
        self.stream.launch_builder(&self.func)
    }
}

impl std::ops::Deref for Func {
    type Target = CudaFunction;

    fn deref(&self) -> &CudaFunction {
        &self.func
    }
}

/// The modules loaded so far, by CUDA context and module name.
static LOADED: Mutex<BTreeMap<(usize, &'static str), Arc<CudaModule>>> = Mutex::new(BTreeMap::new());

/// The function `name` of `module` on `dev`, the module loaded into `dev`'s context on first
/// use.
pub(crate) fn func(dev: &CudaDevice, name: &str, module: &'static Module) -> Result<Func> {
    let stream = dev.cuda_stream();
    let ctx = stream.context();
    let key = (ctx.cu_ctx() as usize, module.name);
    // A panic elsewhere while the lock was held leaves the map itself whole.
    let lookup = || LOADED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(&key).cloned();
    let loaded = match lookup() {
        Some(m) => m,
        None => {
            // Loaded without the lock: one tensor-parallel rank's load must not wait on another
            // rank's, whose GPU may be waiting in an all-reduce for this rank's next launch.
            let image = match module.image {
                Image::Sass(bytes) => Ptx::from_binary(bytes.to_vec()),
                Image::Ptx(text) => Ptx::from_src(text),
            };
            let m = ctx.load_module(image).w()?;
            // Two threads of one context may both load it; the first insert is kept.
            LOADED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).entry(key).or_insert(m).clone()
        }
    };
    Ok(Func { func: loaded.load_function(name).w()?, stream })
}

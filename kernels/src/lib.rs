//! Sequence-mixer ops of Gated DeltaNet / Gated DeltaProduct, behind one interface.
//!
//! The functions in [`ops`] take candle tensors and a [`SlotBuffer`] of per-sequence states,
//! and dispatch on the device. The CPU implementations over plain slices live in [`cpu`]; they
//! double as the reference for other backends. Kernels know nothing of models: they see
//! shapes, not layers. Math follows `docs/model-spec.md` (§1.3, §2.3, §3.4, §3.5).

/// The environment variable `$name`'s value as a count (`Option<usize>`), when set and a
/// number: the `DELTASERVE_*` switches that fix a GPU kernel's choice for comparisons. Each call
/// site reads it once per process (its own `OnceLock`), not per launch.
#[cfg(feature = "cuda")]
macro_rules! env_count {
    ($name:literal) => {{
        static VALUE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
        *VALUE.get_or_init(|| std::env::var($name).ok().and_then(|v| v.parse().ok()))
    }};
}

pub mod arena;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod ops;
pub mod packing;
mod slots;

pub use cpu::conv::ConvActivation;
pub use cpu::norm::GateActivation;
pub use packing::PackedTables;
pub use slots::{index_dtype, HostSlots, SlotBuffer, StepSlots};

/// Chunk length of the chunkwise-parallel (WY/UT) prefill, CPU and GPU. A prompt prefilled in
/// pieces that end at multiples of it gives the same bits as the whole prompt at once (each
/// piece's chunks are the whole prompt's chunks).
pub const PREFILL_CHUNK: usize = 64;

/// A copy of one packed sequence's state taken inside a prefill pass (the prefix cache's
/// snapshots): after the first `tokens` tokens of sequence `seq`, its state is also written to
/// slot `slot` of the same buffer. `tokens` is a positive multiple of [`PREFILL_CHUNK`], so the
/// copy holds the bits a pass that stopped there would have left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capture {
    /// The sequence's index in the pass.
    pub seq: usize,
    /// Tokens of the sequence in this pass before the copy (≤ its length in the pass).
    pub tokens: usize,
    /// Where the copy goes: a slot no sequence of the pass owns.
    pub slot: usize,
}

/// Errors raised by the kernels.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// An input's shape does not fit the op.
    #[error("{op}: `{input}` has shape {actual:?}, expected {expected}")]
    Shape {
        /// The op that checked the shape.
        op: &'static str,
        /// The offending input.
        input: &'static str,
        /// What the op expected, in words.
        expected: String,
        /// The shape it got.
        actual: Vec<usize>,
    },
    /// A slot index past the end of the pool.
    #[error("slot {slot} is out of range: the buffer has {slots} slots")]
    Slot {
        /// The slot asked for.
        slot: usize,
        /// Slots in the buffer.
        slots: usize,
    },
    /// The op has no implementation for this device.
    #[error("{op}: no implementation for device {device}")]
    UnsupportedDevice {
        /// The op.
        op: &'static str,
        /// The device, in words.
        device: String,
    },
    /// The op cannot take these inputs (dtype, alignment, size) in the mode asked for.
    #[error("{op}: unsupported: {what}")]
    Unsupported {
        /// The op.
        op: &'static str,
        /// What it cannot take, in words.
        what: String,
    },
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, KernelError>;

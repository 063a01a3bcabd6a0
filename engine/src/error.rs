//! Error types of the engine: one enum per concern, each variant carrying what was wrong.

use std::path::PathBuf;

/// A `config.json` that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not valid JSON or a field of the wrong JSON type.
    #[error("config.json: {0}")]
    Json(String),
    /// A required field is absent.
    #[error("config.json: missing field `{0}`")]
    Missing(&'static str),
    /// A field holds a value this engine does not support.
    #[error("config.json: unsupported `{field}` = {value}; supported: {supported}")]
    Unsupported {
        /// The field.
        field: String,
        /// Its value as JSON.
        value: String,
        /// What is supported, in words.
        supported: String,
    },
    /// A field holds an impossible value.
    #[error("config.json: invalid `{field}`: expected {expected}, got {actual}")]
    Invalid {
        /// The field.
        field: String,
        /// The constraint.
        expected: String,
        /// The value found.
        actual: String,
    },
}

/// A weight file or tensor that does not match the config.
#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    /// A safetensors file could not be opened or parsed (truncated, corrupt, absent).
    #[error("cannot read weights from {path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A tensor the config requires is absent.
    #[error("missing tensor `{tensor}` (expected shape {expected:?})")]
    Missing {
        /// Checkpoint key.
        tensor: String,
        /// Shape the config implies.
        expected: Vec<usize>,
    },
    /// A tensor's shape disagrees with the config.
    #[error("tensor `{tensor}` has shape {actual:?}, expected {expected:?}")]
    Shape {
        /// Checkpoint key.
        tensor: String,
        /// Shape the config implies.
        expected: Vec<usize>,
        /// Shape on disk.
        actual: Vec<usize>,
    },
    /// A tensor holds NaN or infinity (only checked with `check_weights`).
    #[error("tensor `{tensor}` holds {count} non-finite values")]
    NonFinite {
        /// Checkpoint key.
        tensor: String,
        /// How many.
        count: usize,
    },
    /// A tensor's on-disk dtype is not BF16, F16 or F32.
    #[error("tensor `{tensor}` has dtype {dtype}; supported: BF16, F16, F32")]
    DType {
        /// Checkpoint key.
        tensor: String,
        /// The dtype found.
        dtype: String,
    },
}

/// Anything that can go wrong loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// See [`ConfigError`].
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// See [`WeightError`].
    #[error(transparent)]
    Weights(#[from] WeightError),
    /// A file of the checkpoint could not be read.
    #[error("cannot read {path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The tokenizer files are missing or invalid, or encoding failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A Hugging Face repo could not be resolved.
    #[error("cannot fetch `{repo}` from the Hugging Face Hub: {message}")]
    Hub {
        /// `org/name[@revision]`.
        repo: String,
        /// What went wrong.
        message: String,
    },
    /// Offline mode and the repo is not in the local cache.
    #[error("`{repo}` is not in the Hugging Face cache at {cache} and HF_HUB_OFFLINE is set; download it first or unset HF_HUB_OFFLINE")]
    Offline {
        /// `org/name[@revision]`.
        repo: String,
        /// The cache directory searched.
        cache: PathBuf,
    },
    /// A bad argument from the caller (empty prompt, unknown token id, bad slot...).
    #[error("invalid `{field}`: expected {expected}, got {actual}")]
    Invalid {
        /// The argument.
        field: &'static str,
        /// The constraint.
        expected: String,
        /// The value given.
        actual: String,
    },
    /// The paged KV cache has no room for a sequence's next tokens.
    #[error("KV cache full: {needed} more blocks of {block_size} tokens needed, {available} available")]
    KvCacheFull {
        /// Blocks the pass needs.
        needed: usize,
        /// Blocks it could take.
        available: usize,
        /// Tokens per block.
        block_size: usize,
    },
    /// The model produced NaN or infinite logits: no token can be sampled from them.
    #[error("the model produced {count} non-finite logits (first at token {first}): refusing to sample from them")]
    NonFiniteLogits {
        /// How many of the vocabulary's logits are NaN or ±∞.
        count: usize,
        /// The first such token id.
        first: usize,
    },
    /// A grammar's mask and the logit adjustments left no token to sample.
    #[error("no token is allowed here: the grammar's mask and the logit adjustments exclude every token")]
    NothingAllowed,
    /// A kernel failed.
    #[error(transparent)]
    Kernel(#[from] deltaserve_kernels::KernelError),
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Result alias of the engine.
pub type Result<T> = std::result::Result<T, EngineError>;

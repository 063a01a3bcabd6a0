//! State-size pruning of Gated DeltaNet / Gated DeltaProduct ("On State Reduction in Linear
//! Attention"; pruning-spec.md §7): per q/k head, keep a subset of key/query channels, slice
//! `q_proj`/`k_proj` and the matching short-convolution channels, and write a smaller
//! checkpoint that deltaserve and stock fla load. The recurrent state shrinks from
//! `HV·K·V` to `HV·k·V` per layer.

pub mod calibrate;
pub mod methods;
pub mod progress;
pub mod rrqr;
pub mod write;

use std::path::{Path, PathBuf};

use deltaserve_engine::weights::Checkpoint;
use deltaserve_engine::{CausalLm, DType, Device, Engine, LoadOptions, Logits, ModelConfig, PrefillAlgo};
use progress::Progress;
use serde::Serialize;

pub use methods::Selection;

/// Errors of the pruning tool.
#[derive(Debug, thiserror::Error)]
pub enum PruneError {
    /// Loading or running the model failed.
    #[error(transparent)]
    Engine(#[from] deltaserve_engine::EngineError),
    /// A checkpoint problem.
    #[error(transparent)]
    Weights(#[from] deltaserve_engine::WeightError),
    /// A config problem.
    #[error(transparent)]
    Config(#[from] deltaserve_engine::ConfigError),
    /// A bad option.
    #[error("invalid `{field}`: expected {expected}, got {actual}")]
    Invalid {
        /// The option.
        field: &'static str,
        /// The constraint.
        expected: String,
        /// The value.
        actual: String,
    },
    /// A model this tool cannot prune.
    #[error("cannot prune this checkpoint: {0}")]
    Unsupported(String),
    /// A tensor operation on a named tensor failed.
    #[error("tensor `{tensor}`: {message}")]
    Tensor {
        /// The tensor.
        tensor: String,
        /// What failed.
        message: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
}

/// How channels are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Seeded random subset per head.
    Rand,
    /// Row L1 norms of q_proj + k_proj (data-free).
    L1,
    /// Structured Wanda: |W| weighted by the mixer input's per-feature RMS.
    Swanda,
    /// First-order Taylor: |W ⊙ ΣG| of q_proj/k_proj over the calibration LM loss.
    Grad,
    /// Strong rank-revealing QR of post-conv `[Q; K]` activations (the paper's method).
    Drrqr,
}

impl Method {
    /// Calibration windows used when `--samples` is not given (pruning-spec.md §1.2).
    pub fn default_samples(self) -> usize {
        match self {
            Method::Drrqr => 16,
            Method::Swanda | Method::Grad => 128,
            Method::Rand | Method::L1 => 0,
        }
    }
}

/// Everything `deltaserve prune` takes.
#[derive(Debug, Clone)]
pub struct PruneOptions {
    /// Selection method.
    pub method: Method,
    /// Fraction of channels removed per head, in [0, 1).
    pub ratio: f64,
    /// Input checkpoint directory.
    pub input: PathBuf,
    /// Output directory; `None`: [`default_output`].
    pub output: Option<PathBuf>,
    /// Calibration text (S-Wanda, Grad, DRRQR); `None`: the bundled [`DEFAULT_CALIBRATION`].
    pub calibration: Option<PathBuf>,
    /// Calibration windows (default per method).
    pub samples: Option<usize>,
    /// Tokens per calibration window.
    pub seq_len: usize,
    /// Seed (Rand's subsets, DRRQR's row sample).
    pub seed: u64,
    /// Show a progress bar.
    pub progress: bool,
    /// Where calibration runs (forward passes and gradients); selection and writing stay on
    /// the CPU.
    pub device: Device,
}

/// The calibration text used when none is given: 331 kB of Python standard-library modules
/// (PSF License 2.0; `pruning/data/README.md` says which and why).
pub const DEFAULT_CALIBRATION: &str = include_str!("../data/calibration.txt");

/// Where a pruned checkpoint goes by default: beside the input, named after method and ratio
/// (`ckpt/` → `ckpt-drrqr-0.5/`).
pub fn default_output(input: &Path, method: Method, ratio: f64) -> PathBuf {
    let input = input.components().as_path();
    let name = input.file_name().map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
    let method = format!("{method:?}").to_lowercase();
    input.with_file_name(format!("{name}-{method}-{ratio}"))
}

/// `d_new = max(1, floor(d·(1 − ratio)))`.
pub fn kept_dim(d: usize, ratio: f64) -> usize {
    ((d as f64 * (1.0 - ratio)).floor() as usize).max(1)
}

/// Per-head state statistics before and after (the paper's §2.1 rank utilisation).
#[derive(Debug, Clone, Serialize)]
pub struct RankStats {
    /// Stable rank ‖S‖_F²/‖S‖₂² of each value head's state, `[layer][v-head]`, mean over windows.
    pub stable_rank: Vec<Vec<f64>>,
    /// Stable rank / min(K, V).
    pub rank_utilisation: Vec<Vec<f64>>,
}

/// `pruning_report.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Where the pruned checkpoint was written.
    pub output: PathBuf,
    /// Method.
    pub method: Method,
    /// Ratio asked for.
    pub ratio: f64,
    /// Seed.
    pub seed: u64,
    /// Head dim before and after.
    pub head_dim: (usize, usize),
    /// Calibration windows × tokens used (0 for data-free methods).
    pub calibration_tokens: usize,
    /// Kept channel indices `[layer][head]` (DRRQR: pivot order).
    pub kept: Selection,
    /// State bytes per sequence (conv + recurrent, fp32), before and after.
    pub state_bytes_per_sequence: (usize, usize),
    /// DRRQR's per-head swaps and final ρ.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drrqr: Option<Vec<Vec<methods::HeadInfo>>>,
    /// DRRQR: state rank statistics of the original model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank_before: Option<RankStats>,
    /// DRRQR: the same for the pruned model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank_after: Option<RankStats>,
}

fn check_prunable(cfg: &ModelConfig) -> Result<(), PruneError> {
    if cfg.is_hybrid() || cfg.family != deltaserve_engine::config::Family::Fla {
        return Err(PruneError::Unsupported(format!(
            "`{}` with attention layers: pruning covers fla's pure gated_deltanet and gated_deltaproduct",
            cfg.model_type()
        )));
    }
    if cfg.model_type() == deltaserve_engine::config::DELTA_NET {
        return Err(PruneError::Unsupported("`delta_net`: pruning covers gated_deltanet and gated_deltaproduct".into()));
    }
    if cfg.head_k_dim() < 2 {
        return Err(PruneError::Unsupported(format!("head_dim is {}; nothing to prune", cfg.head_k_dim())));
    }
    Ok(())
}

/// Tokenized calibration windows of `seq_len` tokens, from `path` or the bundled text.
fn windows(engine: &Engine, path: Option<&Path>, count: usize, seq_len: usize) -> Result<Vec<Vec<u32>>, PruneError> {
    let (text, source) = match path {
        Some(p) => {
            (std::fs::read_to_string(p).map_err(|e| PruneError::Io { path: p.into(), message: e.to_string() })?, p.display().to_string())
        }
        None => {
            tracing::info!("no --calibration given: calibrating on the bundled text (331 kB of Python standard-library modules)");
            (DEFAULT_CALIBRATION.to_owned(), "the bundled calibration text".to_owned())
        }
    };
    let ids = engine.encode(&text)?;
    let w: Vec<Vec<u32>> = ids.chunks(seq_len).filter(|c| c.len() == seq_len).take(count).map(<[u32]>::to_vec).collect();
    if w.is_empty() {
        return Err(PruneError::Invalid {
            field: "calibration",
            expected: format!("text of at least {seq_len} tokens (one window of --seq-len)"),
            actual: format!("{} tokens in {source}", ids.len()),
        });
    }
    if w.len() < count {
        tracing::warn!(asked = count, available = w.len(), "calibration text is short; using every full window");
    }
    Ok(w)
}

/// Runs `windows` through `model` and collects per-head state stable ranks.
fn rank_stats(model: &CausalLm, windows: &[Vec<u32>]) -> Result<RankStats, PruneError> {
    let cfg = model.config();
    let (layers, hv, k, v) = (cfg.common.num_hidden_layers, cfg.num_v_heads(), cfg.head_k_dim(), cfg.head_v_dim());
    let mut sr = vec![vec![0.0; hv]; layers];
    let mut pool = model.new_pool(1)?;
    for w in windows {
        let s = pool.allocate().ok_or_else(|| PruneError::Unsupported("empty pool".into()))?;
        model.prefill(&mut pool, s, w, Logits::Last, PrefillAlgo::Chunked)?;
        for (l, row) in sr.iter_mut().enumerate() {
            let st = pool.layer(l).recurrent().ok_or_else(|| PruneError::Unsupported("attention layer".into()))?;
            let st = st.recurrent_state.slot_to_vec(s.index()).map_err(deltaserve_engine::EngineError::from)?;
            for (j, acc) in row.iter_mut().enumerate() {
                *acc += rrqr::stable_rank(&st[j * k * v..(j + 1) * k * v], k, v) / windows.len() as f64;
            }
        }
        pool.release(s)?;
    }
    let util = sr.iter().map(|r| r.iter().map(|x| x / k.min(v) as f64).collect()).collect();
    Ok(RankStats { stable_rank: sr, rank_utilisation: util })
}

/// Prunes `opts.input` into `opts.output` and writes `pruning_report.json`.
pub fn prune(opts: &PruneOptions) -> Result<Report, PruneError> {
    if !(0.0..1.0).contains(&opts.ratio) {
        return Err(PruneError::Invalid { field: "ratio", expected: "in [0, 1)".into(), actual: opts.ratio.to_string() });
    }
    let output = opts.output.clone().unwrap_or_else(|| default_output(&opts.input, opts.method, opts.ratio));
    if output.canonicalize().ok().is_some_and(|o| opts.input.canonicalize().ok() == Some(o)) {
        return Err(PruneError::Invalid {
            field: "output",
            expected: "a directory other than the input".into(),
            actual: output.display().to_string(),
        });
    }
    let engine = Engine::load(&LoadOptions { device: opts.device.clone(), ..LoadOptions::cpu(opts.input.to_string_lossy()) })?;
    let cfg = engine.config().clone();
    check_prunable(&cfg)?;
    let (d, k) = (cfg.head_k_dim(), kept_dim(cfg.head_k_dim(), opts.ratio));
    let ckpt = Checkpoint::open(engine.model_dir())?;
    let samples = opts.samples.unwrap_or(opts.method.default_samples());
    let needs_data = matches!(opts.method, Method::Swanda | Method::Drrqr | Method::Grad);
    let calib = if needs_data { windows(&engine, opts.calibration.as_deref(), samples.max(1), opts.seq_len)? } else { vec![] };
    let taylor = if opts.method == Method::Grad {
        let mut pb = Progress::new(opts.progress, calib.len(), "backprop", "windows");
        let sums = calibrate::taylor_sums(engine.model(), &calib, || pb.inc())?;
        pb.finish();
        Some(sums)
    } else {
        None
    };
    let stats = if matches!(opts.method, Method::Swanda | Method::Drrqr) {
        let wanted = calibrate::Wanted { rms: opts.method == Method::Swanda, qk_rows: opts.method == Method::Drrqr };
        let mut collector =
            calibrate::Collector::new(wanted, cfg.common.num_hidden_layers, cfg.num_heads(), d, cfg.common.hidden_size, opts.seed);
        let mut pb = Progress::new(opts.progress, calib.len(), "calibrating", "windows");
        let qk = deltaserve_engine::reference::qk_proj(engine.model())?;
        for w in &calib {
            collector.observe(engine.model(), w, &qk)?;
            pb.inc();
        }
        pb.finish();
        Some(collector.into_stats())
    } else {
        None
    };
    let (sel, drrqr) = match opts.method {
        Method::Rand => (methods::rand(cfg.common.num_hidden_layers, cfg.num_heads(), d, k, opts.seed), None),
        Method::L1 => (methods::by_weights(&cfg, &ckpt, k, None)?, None),
        Method::Swanda => (methods::by_weights(&cfg, &ckpt, k, stats.as_deref())?, None),
        Method::Grad => match &taylor {
            Some(t) => (methods::grad(&cfg, t, k)?, None),
            None => return Err(PruneError::Unsupported("grad: no gradients were collected".into())),
        },
        Method::Drrqr => {
            let (s, info) = methods::drrqr(&cfg, k, stats.as_deref().unwrap_or_default())?;
            (s, Some(info))
        }
    };
    let new_cfg = write::write_checkpoint(engine.model_dir(), &output, &cfg, &sel)?;
    // The result must load (every shape checked against the new config) and run.
    let pruned = Engine::load(&LoadOptions { device: opts.device.clone(), ..LoadOptions::cpu(output.to_string_lossy()) })?;
    let (rank_before, rank_after) = if opts.method == Method::Drrqr {
        let few = &calib[..calib.len().min(4)];
        (Some(rank_stats(engine.model(), few)?), Some(rank_stats(pruned.model(), few)?))
    } else {
        (None, None)
    };
    let report = Report {
        output: output.clone(),
        method: opts.method,
        ratio: opts.ratio,
        seed: opts.seed,
        head_dim: (d, k),
        calibration_tokens: calib.iter().map(Vec::len).sum(),
        kept: sel,
        state_bytes_per_sequence: (cfg.state_bytes_per_sequence(), new_cfg.state_bytes_per_sequence()),
        drrqr,
        rank_before,
        rank_after,
    };
    let path = output.join("pruning_report.json");
    let json = serde_json::to_string_pretty(&report).map_err(|e| PruneError::Io { path: path.clone(), message: e.to_string() })?;
    std::fs::write(&path, json).map_err(|e| PruneError::Io { path, message: e.to_string() })?;
    Ok(report)
}

/// Loads a model for analysis at f32 on the CPU (used by tests and the CLI summary).
pub fn load_model(dir: &Path) -> Result<CausalLm, PruneError> {
    let cfg = deltaserve_engine::read_config(dir)?;
    Ok(CausalLm::load(&cfg, &Checkpoint::open(dir)?, DType::F32, &Device::Cpu, false)?)
}

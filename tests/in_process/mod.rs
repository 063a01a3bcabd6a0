//! An in-process server for the HTTP tests: the router (`deltaserve::app`) with the engine
//! thread behind it, on a loopback port.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use deltaserve::api::validate::Limits;
use deltaserve::metrics::Metrics;
use deltaserve::scheduler::{self, PrefixCacheConfig, SchedulerConfig};
use deltaserve::{app, AppState, Serving};
use deltaserve_engine::{Engine, LoadOptions};

/// The router's state for the model name "gdn", before a model is set.
pub fn app_state(metrics: Arc<Metrics>, api_key: Option<&str>) -> AppState {
    AppState {
        serving: Arc::new(OnceLock::new()),
        metrics,
        api_key: api_key.map(Into::into),
        draining: Arc::new(AtomicBool::new(false)),
        model_name: "gdn".into(),
        body_limit: 1 << 20,
        body_timeout: Duration::from_secs(60),
        created: 0,
        next_id: Arc::new(AtomicU64::new(0)),
    }
}

/// How a test server is set up.
pub struct Setup {
    pub slots: usize,
    pub kv_blocks: usize,
    pub max_queue: usize,
    pub cache: PrefixCacheConfig,
    /// A chat template (the compact fixtures have none).
    pub template: Option<&'static str>,
    pub metrics: Option<Arc<Metrics>>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            slots: 4,
            kv_blocks: 1024,
            max_queue: 8,
            cache: PrefixCacheConfig { snapshots: 32, grid: 64, host_snapshots: 0, answer_delay: Duration::ZERO },
            template: None,
            metrics: None,
        }
    }
}

/// The app over the checkpoint in `dir`, served on a loopback port by this process, and the
/// engine loaded again for the test to compare with.
pub async fn serve_dir(dir: &std::path::Path, setup: Setup) -> (String, Engine) {
    let engine = Engine::load(&LoadOptions::cpu(dir.to_str().unwrap())).unwrap();
    let metrics = setup.metrics.unwrap_or_else(|| Arc::new(Metrics::new("gdn").unwrap()));
    let state = app_state(metrics.clone(), None);
    let kv_capacity = engine.config().is_hybrid().then_some((setup.kv_blocks, 16));
    let engine_vocab = engine.config().common.vocab_size;
    let limits = Limits {
        served_model_name: "gdn".into(),
        max_model_len: 4096,
        max_n: 4,
        vocab_size: engine.config().common.vocab_size,
        kv_capacity,
    };
    let tokenizer = engine.tokenizer_arc();
    let template = setup.template.map(|t| Arc::new(deltaserve::api::chat::ChatTemplate::new(t, None, None).unwrap()));
    let cfg = SchedulerConfig {
        max_num_seqs: setup.slots,
        kv_blocks: setup.kv_blocks,
        max_queue: setup.max_queue,
        max_model_len: 4096,
        prefix_cache: setup.cache,
        prefill_budget: 64,
        long_prefill_chunk: 64,
        mixed_batches: true,
        // The GPU's opt-in mode, so that the HTTP tests drive its scheduling too (on the CPU
        // the step launched ahead runs before the emit: same tokens, no overlap).
        decode_ahead: true,
        request_timeout: Duration::from_secs(60),
        warmup: true,
        stop_warm_up: Default::default(),
    };
    let (handle, _thread) = scheduler::spawn(engine, cfg, metrics).unwrap();
    let grammars = Some(Arc::new(deltaserve::structured::Grammars::new(&tokenizer, engine_vocab).unwrap()));
    let _ = state.serving.set(Serving { scheduler: handle, tokenizer, template, limits, grammars });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app(state)).await });
    (base, Engine::load(&LoadOptions::cpu(dir.to_str().unwrap())).unwrap())
}

//! Prometheus metrics. Names follow vLLM's under the `deltaserve:` prefix, with vLLM's
//! buckets, so dashboards port; the state pool replaces the KV cache.

use prometheus::{Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

/// vLLM's `time_to_first_token_seconds` buckets.
const TTFT_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0];
/// vLLM's `inter_token_latency_seconds` buckets.
const ITL_BUCKETS: &[f64] = &[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// vLLM's request-latency buckets (e2e, queue).
const REQUEST_BUCKETS: &[f64] =
    &[0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0];
/// Engine step durations (finer than request latencies).
const STEP_BUCKETS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// Decode batch sizes.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// Every metric the server exports.
pub struct Metrics {
    registry: Registry,
    /// Requests with a slot.
    pub num_requests_running: IntGauge,
    /// Requests waiting for a slot.
    pub num_requests_waiting: IntGauge,
    /// Slots owned by a sequence.
    pub state_slots_used: IntGauge,
    /// Slots in the pool.
    pub state_slots_total: IntGauge,
    /// Bytes of the state pool.
    pub state_memory_bytes: IntGauge,
    /// KV blocks held by sequences (hybrid models).
    pub kv_blocks_used: IntGauge,
    /// KV blocks in all.
    pub kv_blocks_total: IntGauge,
    /// Bytes of the KV cache.
    pub kv_memory_bytes: IntGauge,
    /// Fraction of KV blocks in use, 0..1 (vLLM's `kv_cache_usage_perc`).
    pub kv_cache_usage_perc: Gauge,
    /// Prompt tokens prefilled.
    pub prompt_tokens: IntCounter,
    /// Tokens generated.
    pub generation_tokens: IntCounter,
    /// Finished choices by `finished_reason`.
    pub request_success: IntCounterVec,
    /// Error responses by HTTP status code.
    pub request_errors: IntCounterVec,
    /// Requests refused before queueing, by reason.
    pub requests_rejected: IntCounterVec,
    /// Requests whose client left before the end.
    pub client_disconnects: IntCounter,
    /// Time to first token.
    pub time_to_first_token: Histogram,
    /// Time between tokens of a sequence.
    pub inter_token_latency: Histogram,
    /// Arrival to last token.
    pub e2e_latency: Histogram,
    /// Arrival to admission.
    pub request_queue_time: Histogram,
    /// Engine step duration by `phase` (prefill, decode, or mixed: a prefill pass that also
    /// decoded the running sequences).
    pub step_duration: HistogramVec,
    /// Sequences per decode step.
    pub decode_batch_size: Histogram,
    /// Prompt tokens of requests that looked up the prefix cache (vLLM's `prefix_cache_queries`).
    pub prefix_cache_queries: IntCounter,
    /// Of those, tokens found cached (vLLM's `prefix_cache_hits`).
    pub prefix_cache_hits: IntCounter,
    /// Snapshots dropped to make room.
    pub prefix_cache_evictions: IntCounter,
    /// Cached prefixes.
    pub prefix_cache_entries: IntGauge,
    /// Bytes the cache holds: snapshot states and the KV blocks only snapshots reference.
    pub prefix_cache_memory_bytes: IntGauge,
    /// Snapshot slots allocated for the cache (0: off).
    pub prefix_cache_snapshots_total: IntGauge,
    /// Cached prefixes whose snapshot is in host memory.
    pub prefix_cache_host_entries: IntGauge,
    /// Host-memory snapshot slots (0: no host tier).
    pub prefix_cache_host_snapshots_total: IntGauge,
    /// Bytes of host memory allocated for the host tier.
    pub prefix_cache_host_memory_bytes: IntGauge,
    /// Snapshots moved from device to host memory to make room.
    pub prefix_cache_spills: IntCounter,
    /// Prompt text whose ids came from the tokenizer's segment cache, in bytes.
    pub tokenizer_cache_hit_bytes: IntCounter,
    /// Prompt text the segment cache tokenized, in bytes.
    pub tokenizer_cache_miss_bytes: IntCounter,
    /// Segments the tokenizer's cache holds.
    pub tokenizer_cache_entries: IntGauge,
}

fn gauge(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntGauge> {
    let g = IntGauge::new(name, help)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

fn counter(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounter> {
    let c = IntCounter::new(name, help)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

fn counter_vec(r: &Registry, name: &str, help: &str, label: &str) -> prometheus::Result<IntCounterVec> {
    let c = IntCounterVec::new(Opts::new(name, help), &[label])?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

fn histogram(r: &Registry, name: &str, help: &str, buckets: &[f64]) -> prometheus::Result<Histogram> {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))?;
    r.register(Box::new(h.clone()))?;
    Ok(h)
}

impl Metrics {
    /// Creates and registers every metric; `model_name` becomes a constant label.
    pub fn new(model_name: &str) -> prometheus::Result<Self> {
        let mut labels = std::collections::HashMap::new();
        labels.insert("model_name".to_owned(), model_name.to_owned());
        let r = Registry::new_custom(None, Some(labels))?;
        let step_duration = HistogramVec::new(
            HistogramOpts::new(
                "deltaserve:step_duration_seconds",
                "Engine step duration by phase (prefill, decode, or mixed: a prefill pass that also decoded).",
            )
            .buckets(STEP_BUCKETS.to_vec()),
            &["phase"],
        )?;
        r.register(Box::new(step_duration.clone()))?;
        let m = Self {
            num_requests_running: gauge(&r, "deltaserve:num_requests_running", "Requests holding state slots.")?,
            num_requests_waiting: gauge(&r, "deltaserve:num_requests_waiting", "Requests waiting for a state slot.")?,
            state_slots_used: gauge(&r, "deltaserve:state_slots_used", "State-pool slots owned by a sequence.")?,
            state_slots_total: gauge(&r, "deltaserve:state_slots_total", "State-pool slots.")?,
            state_memory_bytes: gauge(&r, "deltaserve:state_memory_bytes", "Bytes allocated for the state pool.")?,
            kv_blocks_used: gauge(
                &r,
                "deltaserve:kv_blocks_used",
                "Paged KV-cache blocks held by sequences (attention layers of hybrids).",
            )?,
            kv_blocks_total: gauge(&r, "deltaserve:kv_blocks_total", "Paged KV-cache blocks.")?,
            kv_memory_bytes: gauge(&r, "deltaserve:kv_memory_bytes", "Bytes allocated for the paged KV cache.")?,
            kv_cache_usage_perc: {
                let g = Gauge::new("deltaserve:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).")?;
                r.register(Box::new(g.clone()))?;
                g
            },
            prompt_tokens: counter(&r, "deltaserve:prompt_tokens_total", "Prompt tokens prefilled.")?,
            generation_tokens: counter(&r, "deltaserve:generation_tokens_total", "Tokens generated.")?,
            request_success: counter_vec(
                &r,
                "deltaserve:request_success_total",
                "Requests finished without error, by the finish reason of their last choice to finish.",
                "finished_reason",
            )?,
            request_errors: counter_vec(&r, "deltaserve:request_errors_total", "Error responses by HTTP status code.", "code")?,
            requests_rejected: counter_vec(&r, "deltaserve:requests_rejected_total", "Requests refused before queueing.", "reason")?,
            client_disconnects: counter(&r, "deltaserve:client_disconnects_total", "Requests cancelled because the client went away.")?,
            time_to_first_token: histogram(&r, "deltaserve:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)?,
            inter_token_latency: histogram(
                &r,
                "deltaserve:inter_token_latency_seconds",
                "Time between consecutive tokens of a sequence.",
                ITL_BUCKETS,
            )?,
            e2e_latency: histogram(&r, "deltaserve:e2e_request_latency_seconds", "Request arrival to completion.", REQUEST_BUCKETS)?,
            request_queue_time: histogram(
                &r,
                "deltaserve:request_queue_time_seconds",
                "Request arrival to admission into a slot.",
                REQUEST_BUCKETS,
            )?,
            step_duration,
            decode_batch_size: histogram(&r, "deltaserve:decode_batch_size", "Sequences per batched decode step.", BATCH_BUCKETS)?,
            prefix_cache_queries: counter(
                &r,
                "deltaserve:prefix_cache_queries_total",
                "Prompt tokens of requests that looked up the prefix cache.",
            )?,
            prefix_cache_hits: counter(&r, "deltaserve:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.")?,
            prefix_cache_evictions: counter(&r, "deltaserve:prefix_cache_evictions_total", "Prefix-cache snapshots evicted.")?,
            prefix_cache_entries: gauge(&r, "deltaserve:prefix_cache_entries", "Prefixes held by the prefix cache.")?,
            prefix_cache_memory_bytes: gauge(
                &r,
                "deltaserve:prefix_cache_memory_bytes",
                "Bytes held by prefix-cache snapshots (states, and KV blocks of hybrids).",
            )?,
            prefix_cache_snapshots_total: gauge(&r, "deltaserve:prefix_cache_snapshots_total", "Snapshot slots of the prefix cache.")?,
            prefix_cache_host_entries: gauge(
                &r,
                "deltaserve:prefix_cache_host_entries",
                "Cached prefixes whose snapshot is in host memory.",
            )?,
            prefix_cache_host_snapshots_total: gauge(
                &r,
                "deltaserve:prefix_cache_host_snapshots_total",
                "Host-memory snapshot slots of the prefix cache (0: no host tier).",
            )?,
            prefix_cache_host_memory_bytes: gauge(
                &r,
                "deltaserve:prefix_cache_host_memory_bytes",
                "Bytes of host memory allocated for the prefix cache's host tier.",
            )?,
            prefix_cache_spills: counter(
                &r,
                "deltaserve:prefix_cache_spills_total",
                "Prefix-cache snapshots moved from device to host memory to make room.",
            )?,
            tokenizer_cache_hit_bytes: counter(
                &r,
                "deltaserve:tokenizer_cache_hit_bytes_total",
                "Bytes of long prompts whose token ids came from the tokenizer's segment cache.",
            )?,
            tokenizer_cache_miss_bytes: counter(
                &r,
                "deltaserve:tokenizer_cache_miss_bytes_total",
                "Bytes of long prompts the tokenizer's segment cache tokenized.",
            )?,
            tokenizer_cache_entries: gauge(&r, "deltaserve:tokenizer_cache_entries", "Prompt segments held by the tokenizer's cache.")?,
            registry: r,
        };
        // Pre-create the common label values so the series exist from the start.
        for reason in ["stop", "length"] {
            m.request_success.with_label_values(&[reason]);
        }
        for code in ["400", "401", "404", "413", "429", "500", "503", "504"] {
            m.request_errors.with_label_values(&[code]);
        }
        for phase in ["prefill", "decode", "mixed"] {
            m.step_duration.with_label_values(&[phase]);
        }
        Ok(m)
    }

    /// Brings the tokenizer cache's series up to its counters (read when scraped).
    pub fn sync_tokenizer_cache(&self, stats: &deltaserve_engine::tokenizer::SegmentStats) {
        self.tokenizer_cache_hit_bytes.inc_by(stats.hit_bytes.saturating_sub(self.tokenizer_cache_hit_bytes.get()));
        self.tokenizer_cache_miss_bytes.inc_by(stats.miss_bytes.saturating_sub(self.tokenizer_cache_miss_bytes.get()));
        self.tokenizer_cache_entries.set(stats.entries as i64);
    }

    /// The text exposition format.
    pub fn render(&self) -> prometheus::Result<String> {
        TextEncoder::new().encode_to_string(&self.registry.gather())
    }
}

//! The router called in process (`deltaserve::app`), with the engine thread behind it: no
//! binary, no startup; the spawn-the-binary tests (`http_api.rs`) check startup and signals.

#[path = "in_process/mod.rs"]
mod in_process;
#[path = "http_in_process/prefix_cache.rs"]
mod prefix_cache;

use std::sync::Arc;
use std::time::Duration;

use deltaserve::app;
use deltaserve::metrics::Metrics;
use deltaserve::scheduler::PrefixCacheConfig;
use deltaserve_engine::sampling::argmax;
use deltaserve_engine::{Engine, LoadOptions, Logits};
use deltaserve_tests::{compact_dir, golden_cases, load_tensors, values};
use in_process::{app_state, serve_dir, Setup};
use serde_json::{json, Value};

/// The app over a compact fixture, served on a loopback port by this process.
async fn serve(model: &str) -> (String, Engine) {
    serve_with(model, 4, 1024).await
}

/// [`serve`] with `slots` state slots and `kv_blocks` KV blocks (of 16 tokens; used by hybrids).
async fn serve_with(model: &str, slots: usize, kv_blocks: usize) -> (String, Engine) {
    serve_queued(model, slots, kv_blocks, 8).await
}

/// [`serve_with`] with `max_queue` requests allowed to wait.
async fn serve_queued(model: &str, slots: usize, kv_blocks: usize, max_queue: usize) -> (String, Engine) {
    let setup = Setup { slots, kv_blocks, max_queue, ..Setup::default() };
    serve_dir(&compact_dir().join(model), setup).await
}

/// The `n` greedy tokens `engine` generates after `ids` (what a server answers at temperature 0).
fn greedy(engine: &Engine, ids: &[u32], n: usize) -> Vec<u32> {
    let mut pool = engine.new_pool(1).unwrap();
    let s = pool.allocate().unwrap();
    let mut logits = engine.prefill(&mut pool, s, ids, Logits::Last).unwrap();
    let mut out = vec![];
    for _ in 0..n {
        let t = argmax(&logits.to_vec1::<f32>().unwrap());
        out.push(t);
        logits = engine.decode(&mut pool, &[(s, t)]).unwrap().squeeze(0).unwrap();
    }
    out
}

/// `n` greedy tokens after `prompt`, from the engine run directly.
fn engine_greedy(engine: &Engine, prompt: &str, n: usize) -> Vec<u32> {
    greedy(engine, &engine.encode(prompt).unwrap(), n)
}

/// POSTs `body` to `{base}/v1/completions` and returns the JSON answer.
async fn complete(client: &reqwest::Client, base: &str, body: Value) -> Value {
    client.post(format!("{base}/v1/completions")).json(&body).send().await.unwrap().json().await.unwrap()
}

#[tokio::test]
async fn delta_net_is_served_with_the_engine_s_greedy_tokens() {
    let (base, engine) = serve("delta_net-gated").await;
    let body = json!({"prompt": "class A:", "max_tokens": 6, "temperature": 0, "ignore_eos": true, "logprobs": 1});
    let r = complete(&reqwest::Client::new(), &base, body).await;
    let ids = engine_greedy(&engine, "class A:", 6);
    assert_eq!(r["choices"][0]["text"], engine.tokenizer().decode(&ids, true).unwrap(), "{r}");
    assert_eq!(r["choices"][0]["logprobs"]["tokens"].as_array().unwrap().len(), 6, "{r}");
}

#[tokio::test]
async fn in_process_router_serves_greedy_completions_and_refusals() {
    let (base, engine) = serve("gdn").await;
    let client = reqwest::Client::new();
    let prompt = "def add(a, b):";
    let r = complete(&client, &base, json!({"prompt": prompt, "max_tokens": 5, "temperature": 0, "ignore_eos": true})).await;
    // The same greedy tokens as the engine run directly.
    let ids = engine_greedy(&engine, prompt, 5);
    assert_eq!(r["choices"][0]["text"], engine.tokenizer().decode(&ids, true).unwrap(), "{r}");
    assert_eq!(r["usage"]["completion_tokens"], 5);

    // A chat request without a template is refused with the envelope, naming `messages`.
    let res = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let e: Value = res.json().await.unwrap();
    assert_eq!(e["error"]["param"], "messages", "{e}");

    let res = client.post(format!("{base}/v1/completions")).json(&json!({"prompt": "x", "model": "other"})).send().await.unwrap();
    assert_eq!(res.status(), 404);

    // The completion above was counted where Prometheus reads it.
    let text = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(text.lines().any(|l| l.starts_with("deltaserve:generation_tokens_total") && l.ends_with(" 5")), "{text}");
}

/// Hybrid checkpoints (fla attn layers, Qwen3.5, OLMo-Hybrid, the MoE hybrids Qwen3-Next and
/// Qwen3.5-MoE) served over HTTP: the greedy text
/// is the reference library's own (its goldens), and the first token's logprob is the log-softmax
/// of the reference's logits.
#[tokio::test]
async fn hybrid_models_serve_their_reference_greedy_text_and_logprobs() {
    let client = reqwest::Client::new();
    for name in ["gdn-attn", "qwen3_5", "olmo_hybrid", "qwen3_next", "qwen3_5_moe"] {
        let (base, engine) = serve(name).await;
        let case = &golden_cases(&compact_dir().join(format!("{name}.goldens.json")))[0];
        let reference = load_tensors(&compact_dir().join(format!("{name}.logits.safetensors")));
        let steps = case.top2_margins.iter().take_while(|m| **m >= 1e-3).count().min(24);
        let body = json!({"prompt": case.prompt, "max_tokens": steps, "temperature": 0, "ignore_eos": true, "logprobs": 1});
        let r = complete(&client, &base, body).await;
        let want = engine.tokenizer().decode(&case.greedy_new_ids[..steps], true).unwrap();
        assert_eq!(r["choices"][0]["text"], want, "{name}: {r}");
        let logits = values(&reference["case0.last_logits"]);
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = max + logits.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln();
        let want_lp = logits[case.greedy_new_ids[0] as usize] as f64 - lse;
        let got_lp = r["choices"][0]["logprobs"]["token_logprobs"][0].as_f64().unwrap();
        assert!((got_lp - want_lp).abs() < 1e-4, "{name}: first logprob {got_lp} vs the reference's {want_lp}");
    }
}

/// The paged KV cache under pressure: 8 blocks of 16 tokens hold two of these requests at a
/// time. Six sent at once all finish with the text each gets alone (the rest wait for blocks,
/// none is refused or corrupted); one that could never fit gets a 400 naming the limit; the KV
/// gauges are published.
#[tokio::test]
async fn kv_cache_admission_waits_for_blocks_and_refuses_what_never_fits() {
    let (base, engine) = serve_with("qwen3_5", 6, 8).await;
    let client = reqwest::Client::new();
    let prompts = ["def add(a, b):", "class A:", "import os", "for i in range(3):", "x = [1, 2]", "while True:"];
    let alone: Vec<String> = prompts.iter().map(|p| engine.tokenizer().decode(&engine_greedy(&engine, p, 40), true).unwrap()).collect();
    let replies = futures::future::join_all(
        prompts.iter().map(|p| complete(&client, &base, json!({"prompt": p, "max_tokens": 40, "temperature": 0, "ignore_eos": true}))),
    )
    .await;
    for ((p, r), want) in prompts.iter().zip(&replies).zip(&alone) {
        assert_eq!(&r["choices"][0]["text"], want, "{p}: {r}");
    }
    let res = client.post(format!("{base}/v1/completions")).json(&json!({"prompt": "x", "max_tokens": 200})).send().await.unwrap();
    assert_eq!(res.status(), 400);
    let e: Value = res.json().await.unwrap();
    assert_eq!(e["error"]["code"], "context_length_exceeded", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("the cache has 8"), "{e}");
    let text = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(text.lines().any(|l| l.starts_with("deltaserve:kv_blocks_total") && l.ends_with(" 8")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("deltaserve:kv_cache_usage_perc")), "{text}");
}

/// Admission counts free slots: with `--max-queue 0` requests that find a slot run (none is
/// refused while one is free), and an instantaneous burst is refused only past slots + queue.
#[tokio::test]
async fn admission_refuses_only_when_slots_and_queue_are_full() {
    let client = reqwest::Client::new();
    let body = |n: usize| json!({"prompt": "a", "max_tokens": n, "ignore_eos": true, "temperature": 0});
    let statuses = |base: String, count: usize, max_tokens: usize| {
        let client = client.clone();
        async move {
            let reqs = (0..count).map(|_| client.post(format!("{base}/v1/completions")).json(&body(max_tokens)).send());
            let mut s: Vec<u16> = futures::future::join_all(reqs).await.into_iter().map(|r| r.unwrap().status().as_u16()).collect();
            s.sort_unstable();
            s
        }
    };
    // No waiting line, two slots: two concurrent requests both run.
    let (base, _) = serve_queued("gdn", 2, 0, 0).await;
    assert_eq!(statuses(base.clone(), 2, 4).await, vec![200, 200], "--max-queue 0 with free slots");
    assert_eq!(statuses(base, 1, 4).await, vec![200]);
    // Two slots, two queued: a burst of four all run; of six long ones, two are refused.
    let (base, _) = serve_queued("gdn", 2, 0, 2).await;
    assert_eq!(statuses(base.clone(), 4, 4).await, vec![200; 4], "a burst within slots + queue");
    assert_eq!(statuses(base, 6, 1500).await, vec![200, 200, 200, 200, 429, 429], "a burst past slots + queue");
}

/// Probes are not errors: `/ready` answering 503 while the model loads is not counted in
/// `request_errors_total`; a real request refused meanwhile is. With an API key, two
/// `Authorization` headers are refused (401), not resolved by taking the first.
#[tokio::test]
async fn probes_are_not_errors_and_duplicate_credentials_are_refused() {
    let metrics = Arc::new(Metrics::new("gdn").unwrap());
    let state = app_state(metrics.clone(), Some("k"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app(state)).await });
    let client = reqwest::Client::new();
    for _ in 0..3 {
        assert_eq!(client.get(format!("{base}/ready")).send().await.unwrap().status(), 503);
    }
    let errors = |code: &str| -> f64 {
        let text = metrics.render().unwrap();
        let line = text.lines().find(|l| l.starts_with("deltaserve:request_errors_total") && l.contains(&format!("code=\"{code}\"")));
        line.and_then(|l| l.rsplit(' ').next()).map_or(0.0, |v| v.parse().unwrap())
    };
    assert_eq!(errors("503"), 0.0, "readiness probes counted as errors");
    let r = client.post(format!("{base}/v1/completions")).bearer_auth("k").json(&json!({"prompt": "a"})).send().await.unwrap();
    assert_eq!(r.status(), 503, "still loading");
    assert_eq!(errors("503"), 1.0, "a refused request is an error");
    let r = client
        .get(format!("{base}/v1/models"))
        .header("Authorization", "Bearer k")
        .header("Authorization", "Bearer someone-else")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "two Authorization headers");
    let r = client.get(format!("{base}/v1/models")).bearer_auth("k").send().await.unwrap();
    assert_ne!(r.status(), 401);
}

/// A prompt too long in bytes to fit `max_model_len` tokens under any tokenization is refused
/// by its byte length, before the tokenizer runs (the message counts bytes, not tokens); one
/// just past the limit in tokens still gets the token count.
#[tokio::test]
async fn an_oversized_prompt_is_refused_by_its_bytes_before_tokenizing() {
    let (base, engine) = serve("gdn").await;
    let client = reqwest::Client::new();
    let bound = 4096 * engine.tokenizer().max_token_bytes() * 2;
    let huge = "ab ".repeat(bound / 3 + 10);
    for (path, body) in
        [("/v1/completions", json!({"prompt": huge})), ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": huge}]}))]
    {
        let v: Value = client.post(format!("{base}{path}")).json(&body).send().await.unwrap().json().await.unwrap();
        let msg = v["error"]["message"].as_str().unwrap();
        assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
        assert!(msg.contains(&format!("{} bytes", huge.len())) && msg.len() < 300, "{msg}");
        assert_eq!(v["error"]["param"], if path.contains("chat") { "messages" } else { "prompt" });
    }
    let long = "ab ".repeat(3000);
    let v: Value = client.post(format!("{base}/v1/completions")).json(&json!({"prompt": long})).send().await.unwrap().json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("tokens"), "{v}");
}

/// Prompts of 1 to ~190 tokens, so that with a 64-token prefill budget most are cut into
/// pieces and share steps with others.
fn varied_prompts(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{i}:{}", " x = y + 1;".repeat(i * 5 % 37))).collect()
}

#[tokio::test]
async fn seeded_sampling_gives_the_same_text_alone_and_among_32_concurrent_requests() {
    for model in ["gdn", "qwen3_5_moe"] {
        let (base, _engine) = serve_queued(model, 32, 1024, 32).await;
        let client = reqwest::Client::new();
        let body = |i: usize, p: &str| {
            json!({"prompt": p, "max_tokens": 12, "temperature": 0.8, "top_p": 0.95, "seed": 1000 + i,
                   "ignore_eos": true, "logprobs": 2})
        };
        let prompts = varied_prompts(32);
        let mut alone = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            alone.push(complete(&client, &base, body(i, p)).await["choices"][0].clone());
        }
        for round in 0..2 {
            let together = futures::future::join_all(prompts.iter().enumerate().map(|(i, p)| {
                let (client, base, body) = (client.clone(), base.clone(), body(i, p));
                async move { complete(&client, &base, body).await["choices"][0].clone() }
            }))
            .await;
            for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
                assert!(a["text"].is_string(), "{model}: request {i}: {a}");
                assert_eq!(t["text"], a["text"], "{model}, round {round}: request {i}'s text differs among 32 from alone");
                assert_eq!(t["logprobs"], a["logprobs"], "{model}, round {round}: request {i}'s logprobs differ among 32 from alone");
            }
        }
        // The seeds matter: different seeds give different texts (so equal texts above are not
        // a sampler that ignores its randomness).
        let distinct: std::collections::HashSet<String> = alone.iter().map(|c| c["text"].as_str().unwrap().to_string()).collect();
        assert!(distinct.len() > 16, "{model}: only {} distinct texts of 32", distinct.len());
    }
}

#[tokio::test]
async fn shutting_the_scheduler_down_fails_what_runs_and_drops_the_engine_before_returning() {
    use deltaserve::scheduler::{self, Event, GenParams, GenRequest, SchedulerConfig, SchedulerError};
    let engine = Engine::load(&LoadOptions::cpu(compact_dir().join("gdn").to_str().unwrap())).unwrap();
    // Held by the engine (and the scheduler's detokenizers) only: gone once they are.
    let tokenizer = Arc::downgrade(&engine.tokenizer_arc());
    let cfg = SchedulerConfig {
        max_num_seqs: 2,
        kv_blocks: 0,
        max_queue: 2,
        max_model_len: 4096,
        prefix_cache: PrefixCacheConfig { snapshots: 4, grid: 64, host_snapshots: 0, answer_delay: Duration::ZERO },
        prefill_budget: 64,
        long_prefill_chunk: 64,
        mixed_batches: true,
        decode_ahead: false,
        request_timeout: Duration::from_secs(60),
        warmup: false,
        stop_warm_up: Default::default(),
    };
    let (handle, _thread) = scheduler::spawn(engine, cfg, Arc::new(Metrics::new("gdn").unwrap())).unwrap();
    let params = GenParams { ignore_eos: true, ..GenParams::new(1_000_000) };
    let (req, mut events) = GenRequest::new("long".into(), vec![1, 2, 3], params.clone());
    handle.submit(req).unwrap();
    // Running: its first token is out.
    assert!(matches!(events.recv().await, Some(Event::Token { .. })));
    assert!(handle.shut_down(Duration::from_secs(30)).await, "the engine thread stopped");
    assert!(!handle.alive());
    assert!(tokenizer.upgrade().is_none(), "the engine was dropped before shut_down returned");
    // The running request ended with the shutdown error, after whatever tokens it had.
    let mut last = None;
    while let Some(e) = events.recv().await {
        last = Some(e);
    }
    assert!(matches!(last, Some(Event::Error(SchedulerError::ShutDown))), "last event: {last:?}");
    let (late, _rx) = GenRequest::new("late".into(), vec![1], params);
    assert_eq!(handle.submit(late), Err(SchedulerError::Stopped));
}

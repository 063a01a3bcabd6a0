//! The router called in process (`deltaserve::app`), with the engine thread behind it: no
//! binary, no startup; the spawn-the-binary tests (`http_api.rs`) check startup and signals.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use deltaserve::api::validate::Limits;
use deltaserve::metrics::Metrics;
use deltaserve::scheduler::{self, SchedulerConfig};
use deltaserve::{app, AppState, Serving};
use deltaserve_engine::sampling::argmax;
use deltaserve_engine::{Engine, LoadOptions, Logits};
use deltaserve_tests::compact_dir;
use serde_json::{json, Value};

/// The app over a compact fixture, served on a loopback port by this process.
async fn serve(model: &str) -> (String, Engine) {
    let dir = compact_dir().join(model);
    let engine = Engine::load(&LoadOptions::cpu(dir.to_str().unwrap())).unwrap();
    let metrics = Arc::new(Metrics::new("gdn").unwrap());
    let state = AppState {
        serving: Arc::new(OnceLock::new()),
        metrics: metrics.clone(),
        api_key: None,
        draining: Arc::new(AtomicBool::new(false)),
        model_name: "gdn".into(),
        body_limit: 1 << 20,
        created: 0,
        next_id: Arc::new(AtomicU64::new(0)),
    };
    let limits = Limits { served_model_name: "gdn".into(), max_model_len: 4096, max_n: 4, vocab_size: engine.config().common.vocab_size };
    let tokenizer = engine.tokenizer_arc();
    let cfg = SchedulerConfig {
        max_num_seqs: 4,
        max_queue: 8,
        max_model_len: 4096,
        prefill_budget: 64,
        request_timeout: Duration::from_secs(60),
    };
    let (handle, _thread) = scheduler::spawn(engine, cfg, metrics).unwrap();
    let _ = state.serving.set(Serving { scheduler: handle, tokenizer, template: None, limits });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app(state)).await });
    (base, Engine::load(&LoadOptions::cpu(dir.to_str().unwrap())).unwrap())
}

/// `n` greedy tokens after `prompt`, from the engine run directly.
fn engine_greedy(engine: &Engine, prompt: &str, n: usize) -> Vec<u32> {
    let mut pool = engine.new_pool(1).unwrap();
    let s = pool.allocate().unwrap();
    let mut logits = engine.prefill(&mut pool, s, &engine.encode(prompt).unwrap(), Logits::Last).unwrap();
    let mut ids = vec![];
    for _ in 0..n {
        let t = argmax(&logits.to_vec1::<f32>().unwrap());
        ids.push(t);
        logits = engine.decode(&mut pool, &[(s, t)]).unwrap().squeeze(0).unwrap();
    }
    ids
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

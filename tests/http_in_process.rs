//! The router called in process (`deltaserve::app`), with the engine thread behind it: no
//! binary, no startup; the spawn-the-binary tests (`http_api.rs`) check startup and signals.

#[path = "in_process/mod.rs"]
mod in_process;

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

/// The value of an unlabelled metric (`name{model_name=...} value`) in `/metrics`.
async fn metric(client: &reqwest::Client, base: &str, name: &str) -> f64 {
    let text = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let line = text.lines().find(|l| l.starts_with(&format!("{name}{{"))).unwrap_or_else(|| panic!("no {name} in /metrics"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Two servers of one model, with the prefix cache (`snapshots` slots) and without it.
async fn cached_and_uncached(dir: &std::path::Path, snapshots: usize, template: Option<&'static str>) -> (String, String) {
    let setup = |snapshots| Setup {
        slots: 8,
        max_queue: 16,
        cache: PrefixCacheConfig { snapshots, grid: 64, host_snapshots: 0, answer_delay: Duration::ZERO },
        template,
        ..Setup::default()
    };
    (serve_dir(dir, setup(snapshots)).await.0, serve_dir(dir, setup(0)).await.0)
}

/// Deterministic token ids below 200 (in every fixture's vocabulary).
fn ids(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + seed * 101 + i * i % 11) % 200 + 3).collect()
}

#[tokio::test]
async fn prefix_cache_hits_change_no_tokens_or_logprobs_at_grid_points_and_around_them() {
    let client = reqwest::Client::new();
    for model in ["gdn", "gdp", "qwen3_5"] {
        let (on, off) = cached_and_uncached(&compact_dir().join(model), 32, None).await;
        let shared = ids(1, 200);
        // Prompts ending one before, on and one after the grid point 128, and going on past it;
        // then the first prompt again (echo + logprobs: every prompt token's logprob, cached
        // prefix or not) and with n = 2.
        let mut bodies = vec![];
        for len in [127, 128, 129, 200] {
            bodies.push(json!({"prompt": &shared[..len], "max_tokens": 6, "temperature": 0, "ignore_eos": true, "logprobs": 2}));
        }
        bodies.push(json!({"prompt": ([&shared[..150], &ids(2, 30)[..]].concat()), "max_tokens": 6, "temperature": 0, "ignore_eos": true, "logprobs": 2}));
        bodies.push(json!({"prompt": &shared[..129], "max_tokens": 4, "temperature": 0, "ignore_eos": true, "logprobs": 1, "echo": true}));
        bodies.push(
            json!({"prompt": &shared[..190], "max_tokens": 5, "temperature": 0.9, "seed": 7, "n": 2, "ignore_eos": true, "logprobs": 1}),
        );
        for (i, body) in bodies.iter().enumerate() {
            let (a, b) = (complete(&client, &on, body.clone()).await, complete(&client, &off, body.clone()).await);
            assert!(b["choices"][0]["text"].is_string(), "{model} request {i}: {b}");
            assert_eq!(a["choices"], b["choices"], "{model} request {i}: the cache changed the output");
        }
        let echoed = complete(&client, &on, bodies[5].clone()).await;
        assert_eq!(echoed["choices"][0]["logprobs"]["tokens"].as_array().unwrap().len(), 129 + 4, "{model}: {echoed}");
        // 127: nothing yet (it leaves 64); 128: 64 (at most 127 tokens; it leaves 128); 129,
        // 200, the 180-token prompt and n = 2: 128.
        let (hits, queries) = (
            metric(&client, &on, "deltaserve:prefix_cache_hits_total").await,
            metric(&client, &on, "deltaserve:prefix_cache_queries_total").await,
        );
        assert_eq!(hits, (64 + 4 * 128) as f64, "{model}: hits");
        assert_eq!(queries, (127 + 128 + 129 + 200 + 180 + 190) as f64, "{model}: queries (echo + logprobs does not look up)");
        assert_eq!(metric(&client, &off, "deltaserve:prefix_cache_queries_total").await, 0.0, "{model}: no cache, no queries");
        println!("{model}: {hits} of {queries} prompt tokens from the cache, same outputs as without it");
    }
}

#[tokio::test]
async fn identical_prefixes_arriving_together_are_prefilled_once() {
    let client = reqwest::Client::new();
    let (on, off) = cached_and_uncached(&compact_dir().join("gdn-attn"), 64, None).await;
    let shared = ids(3, 300);
    let bodies: Vec<Value> = (0..8)
        .map(|i| json!({"prompt": ([&shared[..], &ids(10 + i, 5 + i as usize)[..]].concat()), "max_tokens": 5, "temperature": 0, "ignore_eos": true, "logprobs": 1}))
        .collect();
    let together = futures::future::join_all(bodies.iter().map(|b| complete(&client, &on, b.clone()))).await;
    for (i, (t, b)) in together.iter().zip(&bodies).enumerate() {
        let alone = complete(&client, &off, b.clone()).await;
        assert_eq!(t["choices"], alone["choices"], "request {i}");
    }
    // The 300 shared tokens hold 4 grid points: the first request prefills them, the other 7
    // wait for its snapshots and start at 256.
    let hits = metric(&client, &on, "deltaserve:prefix_cache_hits_total").await;
    assert_eq!(hits, (7 * 256) as f64, "hits");
}

#[tokio::test]
async fn a_tiny_cache_evicts_least_recently_used_prefixes_and_stays_exact() {
    let client = reqwest::Client::new();
    let (on, off) = cached_and_uncached(&compact_dir().join("qwen3_5"), 2, None).await;
    for round in 0..2 {
        for p in 0..4u32 {
            let body = json!({"prompt": ids(20 + p, 140), "max_tokens": 4, "temperature": 0, "ignore_eos": true, "logprobs": 1});
            let (a, b) = (complete(&client, &on, body.clone()).await, complete(&client, &off, body).await);
            assert_eq!(a["choices"], b["choices"], "round {round}, prompt {p}");
        }
    }
    // Each prompt snapshots 64 and 128 into the 2 slots, evicting the previous prompt's two.
    assert_eq!(metric(&client, &on, "deltaserve:prefix_cache_entries").await, 2.0);
    assert_eq!(metric(&client, &on, "deltaserve:prefix_cache_evictions_total").await, 14.0);
    assert_eq!(metric(&client, &on, "deltaserve:prefix_cache_hits_total").await, 0.0, "every prompt was evicted before it came back");
    let mem = metric(&client, &on, "deltaserve:prefix_cache_memory_bytes").await;
    assert!(mem > 0.0, "snapshot states and their KV blocks: {mem}");
}

#[tokio::test]
async fn snapshots_evicted_to_the_host_tier_are_hit_from_there_and_stay_exact() {
    let client = reqwest::Client::new();
    let dir = compact_dir().join("gdn");
    // Two pool snapshots and eight in host memory, against a server without the cache.
    let cache = PrefixCacheConfig { snapshots: 2, grid: 64, host_snapshots: 8, answer_delay: Duration::ZERO };
    let on = serve_dir(&dir, Setup { slots: 4, cache, ..Setup::default() }).await.0;
    let none = PrefixCacheConfig { snapshots: 0, grid: 64, host_snapshots: 0, answer_delay: Duration::ZERO };
    let off = serve_dir(&dir, Setup { slots: 4, cache: none, ..Setup::default() }).await.0;
    let ask = |p: u32, n: usize| json!({"prompt": ids(40 + p, n), "max_tokens": 4, "temperature": 0, "ignore_eos": true, "logprobs": 1});
    let check = |on: Value, off: Value, what: String| assert_eq!(on["choices"], off["choices"], "{what}");
    // Ten prompts of 70 tokens, one snapshot each (at 64): the pool keeps the last two, the
    // eight before them move to the host.
    for p in 0..10 {
        check(complete(&client, &on, ask(p, 70)).await, complete(&client, &off, ask(p, 70)).await, format!("prompt {p}"));
    }
    let m = |name: &'static str| metric(&client, &on, name);
    assert_eq!(m("deltaserve:prefix_cache_spills_total").await, 8.0);
    assert_eq!(m("deltaserve:prefix_cache_evictions_total").await, 0.0, "the host had room for all eight");
    assert_eq!((m("deltaserve:prefix_cache_entries").await, m("deltaserve:prefix_cache_host_entries").await), (10.0, 8.0));
    assert_eq!(m("deltaserve:prefix_cache_host_snapshots_total").await, 8.0);
    // Prompt 0 again, longer: its snapshot is in host memory.
    check(complete(&client, &on, ask(0, 100)).await, complete(&client, &off, ask(0, 100)).await, "from the host".into());
    assert_eq!(m("deltaserve:prefix_cache_hits_total").await, 64.0);
    // Two more prompts push prompts 8 and 9 to the full host, which drops its least recently
    // used: prompts 1 and 2 (prompt 0 was just used).
    for p in 10..12 {
        check(complete(&client, &on, ask(p, 70)).await, complete(&client, &off, ask(p, 70)).await, format!("prompt {p}"));
    }
    assert_eq!((m("deltaserve:prefix_cache_spills_total").await, m("deltaserve:prefix_cache_evictions_total").await), (10.0, 2.0));
    check(complete(&client, &on, ask(1, 100)).await, complete(&client, &off, ask(1, 100)).await, "prompt 1, dropped".into());
    assert_eq!(m("deltaserve:prefix_cache_hits_total").await, 64.0, "prompt 1's snapshot is gone");
    check(complete(&client, &on, ask(0, 100)).await, complete(&client, &off, ask(0, 100)).await, "prompt 0, kept".into());
    assert_eq!(m("deltaserve:prefix_cache_hits_total").await, 128.0, "prompt 0's is still on the host");
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

/// One chat turn sent to a server with the prefix cache (`on`) and one without (`off`): asserts
/// both give the same choices; returns the cached server's response and its cache hits (tokens).
async fn chat_turn(client: &reqwest::Client, on: &str, off: &str, body: &Value, turn: usize) -> (Value, f64) {
    let before = metric(client, on, "deltaserve:prefix_cache_hits_total").await;
    let (a, b) =
        (client.post(format!("{on}/v1/chat/completions")).json(body), client.post(format!("{off}/v1/chat/completions")).json(body));
    let (a, b): (Value, Value) = (a.send().await.unwrap().json().await.unwrap(), b.send().await.unwrap().json().await.unwrap());
    assert_eq!(a["choices"], b["choices"], "turn {turn}: the cache changed the answer");
    let hits = metric(client, on, "deltaserve:prefix_cache_hits_total").await - before;
    (a, hits)
}

/// The token ids a server renders for chat `messages` with [`TEMPLATE`].
fn chat_prompt(engine: &Engine, messages: &Value) -> Vec<u32> {
    let template = deltaserve::api::chat::ChatTemplate::new(TEMPLATE, None, None).unwrap();
    let msgs = deltaserve::api::chat::parse_messages(Some(messages)).unwrap();
    deltaserve::api::validate::render_chat_prompt(&template, engine.tokenizer(), &msgs, None, None).unwrap().ids
}

/// A chat template in the shape of Qwen's.
/// (The generation prompt is an expression: Jinja drops a template's final newline.)
const TEMPLATE: &str =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{{ '<|im_start|>assistant\\n' }}";

#[tokio::test]
async fn a_chat_s_next_turn_finds_the_previous_turn_and_its_answer_cached() {
    let client = reqwest::Client::new();
    let demo = deltaserve_tests::tests_dir().join("../models/gdn-demo");
    let (on, off) = cached_and_uncached(&demo, 64, Some(TEMPLATE)).await;
    let engine = Engine::load(&LoadOptions::cpu(demo.to_str().unwrap())).unwrap();
    let prompt = |m: &Value| chat_prompt(&engine, m);
    // The 40 greedy tokens the engine generates after `ids` (what the server answers).
    let answer = |ids: &[u32]| greedy(&engine, ids, 40);
    let mut messages = json!([{"role": "system", "content": "You write Python. ".repeat(30)}]);
    let (mut prev, mut beyond_prompt) = (Vec::new(), 0);
    for turn in 0..4 {
        messages.as_array_mut().unwrap().push(json!({"role": "user", "content": format!("Question {turn}: define a function.")}));
        let this = prompt(&messages);
        let body = json!({"messages": messages, "max_tokens": 40, "temperature": 0, "ignore_eos": true, "logprobs": true});
        let (a, hits) = chat_turn(&client, &on, &off, &body, turn).await;
        // The previous prompt's grid points that this one shares, and those of the previous
        // prompt with its answer (re-prefilled for the cache): the hit is the longer.
        let shared = deltaserve_tests::common_prefix(&prev, &this).min(this.len() - 1) / 64 * 64;
        let with_answer = if prev.is_empty() { vec![] } else { [&prev[..], &answer(&prev)[..]].concat() };
        let grid = |n: usize| n.min(this.len() - 1) / 64 * 64;
        let want = grid(deltaserve_tests::common_prefix(&with_answer, &this)).max(shared);
        println!(
            "turn {turn}: {hits} of {} prompt tokens from the cache (the previous prompt gives {shared}, with its answer {want})",
            this.len()
        );
        assert_eq!(hits, want as f64, "turn {turn}");
        beyond_prompt += want - shared;
        let answer = a["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        messages.as_array_mut().unwrap().push(json!({"role": "assistant", "content": answer}));
        prev = this;
        // The answer is re-prefilled for the cache after it is sent; give it a moment.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(beyond_prompt > 0, "the re-prefilled answers were never hit");
    // Each turn re-sent the conversation: its earlier segments' ids came from the tokenizer's
    // cache (the ids themselves are checked against the tokenizers library in
    // tokenizer_segments.rs).
    let (hit, missed) = (
        metric(&client, &on, "deltaserve:tokenizer_cache_hit_bytes_total").await,
        metric(&client, &on, "deltaserve:tokenizer_cache_miss_bytes_total").await,
    );
    assert!(hit > missed && missed > 0.0, "tokenizer cache: {hit} bytes hit, {missed} tokenized");
}

/// A follow-up sent while the previous turn's answer waits to be re-prefilled (an agent's, sent
/// at once) gives that re-prefill up and prefills the answer in its own pass: the same output
/// as without the cache, the hit only the previous prompt's grid points, and the given-up
/// re-prefill's slot freed (here the delay is a minute, so no re-prefill ever runs by itself).
/// A re-prefill is given up by a request that re-sends it through its last grid point, or that
/// re-sends its whole prompt and goes on (the next turn of that conversation, whether or not
/// the answer's text tokenizes back to the answer's tokens).
#[tokio::test]
async fn a_follow_up_sent_at_once_prefills_the_answer_itself_with_the_same_output() {
    let client = reqwest::Client::new();
    let demo = deltaserve_tests::tests_dir().join("../models/gdn-demo");
    let cache = |snapshots| PrefixCacheConfig { snapshots, grid: 64, host_snapshots: 0, answer_delay: Duration::from_secs(60) };
    let setup = |snapshots| Setup { slots: 8, max_queue: 16, cache: cache(snapshots), template: Some(TEMPLATE), ..Setup::default() };
    let (on, off) = (serve_dir(&demo, setup(64)).await.0, serve_dir(&demo, setup(0)).await.0);
    let engine = Engine::load(&LoadOptions::cpu(demo.to_str().unwrap())).unwrap();
    let mut messages = json!([{"role": "system", "content": "You write Python. ".repeat(30)}]);
    let mut prev: Vec<u32> = Vec::new();
    // Re-prefills waiting (each a turn's prompt and answer, the prompt's length, the last grid
    // point), and how many a later turn continued and so gave up.
    let (mut waiting, mut given_up): (Vec<(Vec<u32>, usize, usize)>, usize) = (Vec::new(), 0);
    for turn in 0..3 {
        messages.as_array_mut().unwrap().push(json!({"role": "user", "content": format!("Question {turn}: define a function.")}));
        let this = chat_prompt(&engine, &messages);
        // 100 tokens: every answer crosses a grid point past its prompt's, so each turn leaves a
        // re-prefill waiting.
        let body = json!({"messages": messages, "max_tokens": 100, "temperature": 0, "ignore_eos": true, "logprobs": true});
        let (a, hits) = chat_turn(&client, &on, &off, &body, turn).await;
        let shared = deltaserve_tests::common_prefix(&prev, &this).min(this.len() - 1) / 64 * 64;
        assert_eq!(hits, shared as f64, "turn {turn}: only the previous prompt's grid points are cached");
        let before = waiting.len();
        waiting.retain(|(tokens, prompt, end)| {
            let shared = deltaserve_tests::common_prefix(tokens, &this);
            shared < *end && !(shared >= *prompt && this.len() > *prompt)
        });
        given_up += before - waiting.len();
        let tokens = [&this[..], &greedy(&engine, &this, 100)[..]].concat();
        let end = tokens.len() / 64 * 64;
        waiting.push((tokens, this.len(), end));
        // A waiting re-prefill holds its turn's slot; a given-up one's is free.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let slots = metric(&client, &on, "deltaserve:state_slots_used").await;
        assert_eq!(slots, waiting.len() as f64, "turn {turn}: slots held by waiting re-prefills");
        let answer = a["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        messages.as_array_mut().unwrap().push(json!({"role": "assistant", "content": answer}));
        prev = this;
    }
    // Every turn after the first continues the one before.
    assert_eq!(given_up, 2, "re-prefills given up by the next turn");
}

#[tokio::test]
async fn a_cancelled_stream_leaves_its_prompt_cached_and_the_cache_consistent() {
    let client = reqwest::Client::new();
    let (on, off) = cached_and_uncached(&compact_dir().join("gdn-attn"), 32, None).await;
    let prompt = ids(5, 300);
    // A long stream, dropped after its first event: the prompt was prefilled (and snapshotted),
    // the decode is cancelled and its slot and KV blocks freed.
    let body = json!({"prompt": prompt, "max_tokens": 2000, "ignore_eos": true, "stream": true});
    let mut res = client.post(format!("{on}/v1/completions")).json(&body).send().await.unwrap();
    assert!(res.chunk().await.unwrap().is_some());
    drop(res);
    for _ in 0..100 {
        if metric(&client, &on, "deltaserve:client_disconnects_total").await >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metric(&client, &on, "deltaserve:num_requests_running").await, 0.0);
    let again = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": true, "logprobs": 1});
    let (a, b) = (complete(&client, &on, again.clone()).await, complete(&client, &off, again).await);
    assert_eq!(a["choices"], b["choices"]);
    assert_eq!(metric(&client, &on, "deltaserve:prefix_cache_hits_total").await, 256.0, "the cancelled request's snapshots");
    // Nothing runs; the snapshots at 64 … 256 hold the first 256 tokens' 16 blocks, shared.
    assert_eq!(metric(&client, &on, "deltaserve:prefix_cache_entries").await, 4.0);
    assert_eq!(metric(&client, &on, "deltaserve:kv_blocks_used").await, 16.0);
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
    };
    let (handle, _thread) = scheduler::spawn(engine, cfg, Arc::new(Metrics::new("gdn").unwrap())).unwrap();
    let params = GenParams {
        n: 1,
        max_tokens: 1_000_000,
        sampling: Default::default(),
        stop: vec![],
        stop_token_ids: vec![],
        ignore_eos: true,
        logprobs: None,
        prompt_logprobs: false,
        cache_output: false,
        constraint: None,
    };
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

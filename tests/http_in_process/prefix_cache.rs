//! The prefix cache behind the router: hits change no output, identical prefixes prefill once,
//! eviction (to nothing or to the host tier), chat turns and cancelled streams.

use super::*;

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

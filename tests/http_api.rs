//! The real `deltaserve serve` process on a loopback port, driven by an HTTP client.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use deltaserve_engine::sampling::argmax;
use deltaserve_engine::{Engine, LoadOptions, Logits};
use deltaserve_tests::compact_dir;
use futures::StreamExt;
use serde_json::{json, Value};

/// A running server; killed on drop.
struct Server {
    child: Child,
    base: String,
    client: reqwest::Client,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn model_dir() -> String {
    compact_dir().join("gdn").to_string_lossy().into_owned()
}

/// Starts the server with extra flags and waits until `/ready` answers 200.
async fn start(extra: &[&str]) -> Server {
    start_with(extra, true).await
}

/// As [`start`]; with `keep_log == false` the read end of the server's stderr is closed as soon
/// as the address is logged, so every later log line fails to write.
async fn start_with(extra: &[&str], keep_log: bool) -> Server {
    let host: &[&str] = if extra.contains(&"--host") { &[] } else { &["--host", "127.0.0.1"] };
    let mut child = Command::new(env!("CARGO_BIN_EXE_deltaserve"))
        .args(["--log-json", "serve", "--model", &model_dir(), "--port", "0"])
        .args(host)
        .args(extra)
        .env("DELTASERVE_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn deltaserve");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !sent {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if let Some(a) = v["fields"]["address"].as_str() {
                        let _ = tx.send(a.to_owned());
                        sent = true;
                        if !keep_log {
                            return;
                        }
                    }
                }
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(30)).expect("server did not log its address");
    let server = Server { child, base: format!("http://{addr}"), client: reqwest::Client::new() };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = server.client.get(format!("{}/ready", server.base)).send().await {
            if r.status() == 200 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "server never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server
}

impl Server {
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self.client.post(format!("{}{path}", self.base)).json(&body).send().await.expect("request");
        let status = r.status().as_u16();
        let text = r.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// Posts a streaming request; returns every `data:` payload in order.
    async fn stream(&self, path: &str, body: Value) -> Vec<String> {
        let r = self.client.post(format!("{}{path}", self.base)).json(&body).send().await.expect("request");
        assert_eq!(r.status(), 200, "stream status");
        assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
        let text = r.text().await.expect("body");
        text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(str::to_owned).collect()
    }

    /// Opens a streaming completion; its body's chunks as they come.
    async fn open_stream(&self, body: Value) -> impl futures::Stream<Item = reqwest::Result<impl std::ops::Deref<Target = [u8]>>> {
        let r = self.client.post(format!("{}/v1/completions", self.base)).json(&body).send().await.expect("request");
        r.bytes_stream()
    }

    async fn metrics(&self) -> String {
        self.client.get(format!("{}/metrics", self.base)).send().await.unwrap().text().await.unwrap()
    }
}

/// Value of a sample line `name{labels} value` (labels matched as a substring).
fn sample(metrics: &str, name: &str, labels: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']) && l.contains(labels))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name}{{{labels}}}"))
}

/// The engine's own greedy continuation of `prompt`, as text, stopping at EOS.
fn engine_greedy(prompt: &str, max_tokens: usize) -> (String, &'static str) {
    let engine = Engine::load(&LoadOptions::cpu(model_dir())).unwrap();
    let ids = engine.encode(prompt).unwrap();
    let mut pool = engine.new_pool(1).unwrap();
    let s = pool.allocate().unwrap();
    let mut logits = engine.prefill(&mut pool, s, &ids, Logits::Last).unwrap().to_vec1::<f32>().unwrap();
    let mut out = Vec::new();
    for _ in 0..max_tokens {
        let t = argmax(&logits);
        if engine.tokenizer().eos_token_ids.contains(&t) {
            return (engine.tokenizer().decode(&out, true).unwrap(), "stop");
        }
        out.push(t);
        logits = engine.decode(&mut pool, &[(s, t)]).unwrap().squeeze(0).unwrap().to_vec1::<f32>().unwrap();
    }
    (engine.tokenizer().decode(&out, true).unwrap(), "length")
}

#[tokio::test]
async fn completions_json_and_sse_match_the_engine() {
    let srv = start(&[]).await;
    let prompt = "def fibonacci(n):\n";
    let (want, reason) = engine_greedy(prompt, 24);

    let (st, v) = srv.post("/v1/completions", json!({"prompt": prompt, "max_tokens": 24, "temperature": 0})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], want);
    assert_eq!(v["choices"][0]["finish_reason"], reason);
    let u = &v["usage"];
    assert_eq!(u["total_tokens"].as_u64(), Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()));

    let events = srv.post_stream_completion(prompt).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0, "usage chunk has no choices");
    assert_eq!(usage["usage"], v["usage"]);
    let text: String =
        chunks.iter().flat_map(|c| c["choices"].as_array().unwrap().iter()).map(|c| c["text"].as_str().unwrap().to_owned()).collect();
    assert_eq!(text, want, "streamed text equals the engine's greedy text");
    let finish: Vec<&Value> =
        chunks.iter().flat_map(|c| c["choices"].as_array().unwrap()).map(|c| &c["finish_reason"]).filter(|f| !f.is_null()).collect();
    assert_eq!(finish, vec![&json!(reason)]);
}

impl Server {
    async fn post_stream_completion(&self, prompt: &str) -> Vec<String> {
        self.stream(
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}),
        )
        .await
    }
}

#[tokio::test]
async fn completion_fields_behave() {
    let srv = start(&[]).await;
    // Token-id prompts, lists of prompts, n, echo, logprobs, seed, stop, penalties, bias, user.
    let (st, a) = srv.post("/v1/completions", json!({"prompt": "import os", "max_tokens": 12, "seed": 7, "temperature": 1.0, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "user": "u1"})).await;
    assert_eq!(st, 200, "{a}");
    let (_, b) = srv
        .post(
            "/v1/completions",
            json!({"prompt": "import os", "max_tokens": 12, "seed": 7, "temperature": 1.0, "top_p": 0.9, "top_k": 40, "min_p": 0.05}),
        )
        .await;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"], "same seed, same text");

    let (_, tok) = srv.post("/tokenize", json!({"prompt": "import os"})).await;
    let ids = tok["tokens"].clone();
    assert_eq!(tok["count"].as_u64(), Some(ids.as_array().unwrap().len() as u64));
    let (_, by_ids) = srv
        .post(
            "/v1/completions",
            json!({"prompt": ids, "max_tokens": 12, "seed": 7, "temperature": 1.0, "top_p": 0.9, "top_k": 40, "min_p": 0.05}),
        )
        .await;
    assert_eq!(by_ids["choices"][0]["text"], a["choices"][0]["text"], "token-id prompt equals text prompt");
    let (_, detok) = srv.post("/detokenize", json!({"tokens": ids})).await;
    assert_eq!(detok["prompt"], "<s>import os");

    let (st, v) = srv.post("/v1/completions", json!({"prompt": ["a b", "c d"], "n": 2, "max_tokens": 3, "seed": 1})).await;
    assert_eq!(st, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    assert_eq!(choices.iter().map(|c| c["index"].as_u64().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    assert_eq!(v["usage"]["completion_tokens"], 12);

    let (st, v) =
        srv.post("/v1/completions", json!({"prompt": "x = 1", "echo": true, "logprobs": 3, "max_tokens": 4, "temperature": 0})).await;
    assert_eq!(st, 200, "{v}");
    let c = &v["choices"][0];
    assert!(c["text"].as_str().unwrap().starts_with("x = 1"), "{c}");
    let lp = &c["logprobs"];
    let n_prompt = v["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n_prompt + 4);
    assert!(lp["token_logprobs"][0].is_null());
    assert!(lp["token_logprobs"].as_array().unwrap()[1..].iter().all(|x| x.as_f64().unwrap() <= 0.0));
    assert_eq!(lp["top_logprobs"][n_prompt].as_object().unwrap().len(), 3);

    // Stop strings end the text before the match; stop_token_ids and ignore_eos are honoured.
    let (_, free) = srv.post("/v1/completions", json!({"prompt": "def f(", "max_tokens": 16, "temperature": 0, "ignore_eos": true})).await;
    let full = free["choices"][0]["text"].as_str().unwrap().to_owned();
    let cut = full.char_indices().nth(5).map(|(i, _)| i).unwrap_or(full.len());
    let stop = full[cut..].chars().take(2).collect::<String>();
    if !stop.is_empty() {
        let (_, v) = srv
            .post(
                "/v1/completions",
                json!({"prompt": "def f(", "max_tokens": 16, "temperature": 0, "ignore_eos": true, "stop": [stop.clone()]}),
            )
            .await;
        let text = v["choices"][0]["text"].as_str().unwrap();
        assert_eq!(text, &full[..full.find(&stop).unwrap()]);
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(v["choices"][0]["stop_reason"], json!(stop));
    }
    let (_, first) = srv.post("/tokenize", json!({"prompt": "def f(", "add_special_tokens": true})).await;
    let (_, g) = srv.post("/v1/completions", json!({"prompt": first["tokens"], "max_tokens": 1, "temperature": 0, "logprobs": 1})).await;
    let greedy_tok: u32 = {
        let t = g["choices"][0]["logprobs"]["top_logprobs"][0].as_object().unwrap();
        let (_, ids) = srv.post("/tokenize", json!({"prompt": t.keys().next().unwrap(), "add_special_tokens": false})).await;
        ids["tokens"][0].as_u64().unwrap() as u32
    };
    let (_, v) =
        srv.post("/v1/completions", json!({"prompt": "def f(", "max_tokens": 5, "temperature": 0, "stop_token_ids": [greedy_tok]})).await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 1);
    // A large negative bias on the greedy token changes the first choice.
    let (_, v) = srv
        .post(
            "/v1/completions",
            json!({"prompt": "def f(", "max_tokens": 1, "temperature": 0, "logit_bias": {greedy_tok.to_string(): -100}, "logprobs": 0}),
        )
        .await;
    assert_ne!(v["choices"][0]["logprobs"]["tokens"][0], g["choices"][0]["logprobs"]["tokens"][0]);
    let (st, v) = srv.post("/v1/completions", json!({"prompt": "def f(", "max_tokens": 8, "presence_penalty": 1.5, "frequency_penalty": 1.0, "repetition_penalty": 1.3, "best_of": 1})).await;
    assert_eq!(st, 200, "{v}");

    let (_, models) =
        srv.client.get(format!("{}/v1/models", srv.base)).send().await.unwrap().json::<Value>().await.map(|v| (0, v)).unwrap();
    assert_eq!(models["data"][0]["id"], "gdn");
    assert_eq!(srv.client.get(format!("{}/health", srv.base)).send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn chat_completions_render_the_template() {
    let srv = start(&[]).await;
    let messages = json!([{"role": "system", "content": "short"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]);
    let (_, tok) = srv.post("/tokenize", json!({"messages": messages})).await;
    let (_, text) = srv.post("/detokenize", json!({"tokens": tok["tokens"]})).await;
    assert_eq!(text["prompt"], "<s># system:\nshort\n# user:\nhi\n# assistant:\n");
    let (st, v) = srv
        .post("/v1/chat/completions", json!({"messages": messages, "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 2}))
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["usage"]["prompt_tokens"], tok["count"]);
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len() as u64, v["usage"]["completion_tokens"].as_u64().unwrap());
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
    // Same request streamed: role first, same text, final finish_reason, usage, [DONE].
    let events = srv
        .stream(
            "/v1/chat/completions",
            json!({"messages": messages, "max_tokens": 6, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}),
        )
        .await;
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    let text: String =
        chunks.iter().flat_map(|c| c["choices"].as_array().unwrap()).filter_map(|c| c["delta"]["content"].as_str()).collect();
    assert_eq!(text, v["choices"][0]["message"]["content"].as_str().unwrap());
    assert_eq!(chunks.last().unwrap()["usage"], v["usage"]);
    assert_eq!(events.last().unwrap(), "[DONE]");
}

#[tokio::test]
async fn concurrent_streams_batch_and_each_equals_its_solo_run() {
    let srv = start(&["--max-num-seqs", "32"]).await;
    let prompts: Vec<String> = (0..32).map(|i| format!("def f{i}(x):\n    return x * {i}")).collect();
    let body = |p: &str| json!({"prompt": p, "max_tokens": 20, "temperature": 0, "ignore_eos": true, "stream": true});
    let mut solo = Vec::new();
    for p in &prompts {
        let (_, v) = srv.post("/v1/completions", json!({"prompt": p, "max_tokens": 20, "temperature": 0, "ignore_eos": true})).await;
        solo.push(v["choices"][0]["text"].as_str().unwrap().to_owned());
    }
    let before = srv.metrics().await;
    let together = futures::future::join_all(prompts.iter().map(|p| srv.stream("/v1/completions", body(p)))).await;
    for (i, events) in together.iter().enumerate() {
        let text: String = events
            .iter()
            .filter(|e| *e != "[DONE]")
            .map(|e| serde_json::from_str::<Value>(e).unwrap())
            .flat_map(|c| c["choices"].as_array().unwrap().clone())
            .map(|c| c["text"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(text, solo[i], "stream {i} differs from its solo run");
    }
    // Several sequences decoded in one step: batches above 8 happened during the burst.
    let after = srv.metrics().await;
    let small = |m: &str| sample(m, "deltaserve:decode_batch_size_bucket", "le=\"8\"");
    let all = |m: &str| sample(m, "deltaserve:decode_batch_size_count", "");
    let big_steps = (all(&after) - small(&after)) - (all(&before) - small(&before));
    assert!(big_steps > 0.0, "no decode step held more than 8 sequences");
    assert_eq!(sample(&after, "deltaserve:state_slots_used", ""), 0.0);
}

#[tokio::test]
async fn dropped_streams_free_their_slots() {
    let srv = start(&["--max-num-seqs", "8"]).await;
    for _ in 0..6 {
        let mut s = Box::pin(srv.open_stream(json!({"prompt": "a", "max_tokens": 5000, "ignore_eos": true, "stream": true})).await);
        // Read a few chunks, then hang up.
        for _ in 0..3 {
            s.next().await;
        }
        drop(s);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = srv.metrics().await;
        if sample(&m, "deltaserve:state_slots_used", "") == 0.0 && sample(&m, "deltaserve:num_requests_running", "") == 0.0 {
            assert!(sample(&m, "deltaserve:client_disconnects_total", "") >= 6.0);
            break;
        }
        assert!(Instant::now() < deadline, "slots not freed after disconnects:\n{m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn overload_gets_429_with_retry_after_and_nothing_hangs() {
    let srv = start(&["--max-num-seqs", "1", "--max-queue", "2"]).await;
    let reqs = (0..10).map(|_| {
        srv.client.post(format!("{}/v1/completions", srv.base)).json(&json!({"prompt": "a", "max_tokens": 200, "ignore_eos": true})).send()
    });
    let results = tokio::time::timeout(Duration::from_secs(120), futures::future::join_all(reqs)).await.expect("requests hung");
    let mut ok = 0;
    let mut limited = 0;
    for r in results {
        let r = r.unwrap();
        match r.status().as_u16() {
            200 => ok += 1,
            429 => {
                assert_eq!(r.headers()["retry-after"], "1");
                let v: Value = r.json().await.unwrap();
                assert_eq!(v["error"]["type"], "rate_limit_error");
                limited += 1;
            }
            s => panic!("unexpected status {s}"),
        }
    }
    assert!(ok >= 1 && limited >= 1, "ok {ok}, limited {limited}");
    assert_eq!(ok + limited, 10);
    let m = srv.metrics().await;
    assert_eq!(sample(&m, "deltaserve:request_errors_total", "code=\"429\""), limited as f64);
    // Still serving normally.
    let (st, _) = srv.post("/v1/completions", json!({"prompt": "a", "max_tokens": 2})).await;
    assert_eq!(st, 200);
}

#[tokio::test]
async fn bad_requests_get_the_right_status_and_type() {
    let srv = start(&["--max-model-len", "64", "--max-num-seqs", "4", "--max-body-bytes", "20000"]).await;
    let big = "x".repeat(30_000);
    let long_ids: Vec<u32> = vec![5; 64];
    let c = "/v1/completions";
    let chat = "/v1/chat/completions";
    let user = json!([{"role": "user", "content": "hi"}]);
    let long_chat = json!([{"role": "user", "content": "a ".repeat(80)}]);
    let cases: Vec<(&str, Value, u16, &str, Option<&str>)> = vec![
        (c, json!({}), 400, "invalid_request_error", Some("prompt")),
        (c, json!({"prompt": 5}), 400, "invalid_request_error", Some("prompt")),
        (c, json!({"prompt": []}), 400, "invalid_request_error", Some("prompt")),
        (c, json!({"prompt": null}), 400, "invalid_request_error", Some("prompt")),
        (c, json!({"prompt": [[]]}), 400, "invalid_request_error", Some("prompt[0]")),
        (c, json!({"prompt": [1, "a"]}), 400, "invalid_request_error", Some("prompt[1]")),
        (c, json!({"prompt": [99999]}), 400, "invalid_request_error", Some("prompt[0]")),
        (c, json!({"prompt": [-1]}), 400, "invalid_request_error", Some("prompt[0]")),
        (c, json!({"prompt": long_ids}), 400, "invalid_request_error", Some("prompt")),
        (c, json!({"prompt": "a", "max_tokens": 100}), 400, "invalid_request_error", Some("max_tokens")),
        (c, json!({"prompt": "a", "max_tokens": 0}), 400, "invalid_request_error", Some("max_tokens")),
        (c, json!({"prompt": "a", "max_tokens": -3}), 400, "invalid_request_error", Some("max_tokens")),
        (c, json!({"prompt": "a", "temperature": -0.5}), 400, "invalid_request_error", Some("temperature")),
        (c, json!({"prompt": "a", "temperature": "hot"}), 400, "invalid_request_error", Some("temperature")),
        (c, json!({"prompt": "a", "top_p": 0}), 400, "invalid_request_error", Some("top_p")),
        (c, json!({"prompt": "a", "top_p": 1.5}), 400, "invalid_request_error", Some("top_p")),
        (c, json!({"prompt": "a", "top_k": -2}), 400, "invalid_request_error", Some("top_k")),
        (c, json!({"prompt": "a", "min_p": 2}), 400, "invalid_request_error", Some("min_p")),
        (c, json!({"prompt": "a", "n": 0}), 400, "invalid_request_error", Some("n")),
        (c, json!({"prompt": "a", "n": 5}), 400, "invalid_request_error", Some("n")),
        (c, json!({"prompt": "a", "best_of": 3}), 400, "invalid_request_error", Some("best_of")),
        (c, json!({"prompt": "a", "logprobs": 21}), 400, "invalid_request_error", Some("logprobs")),
        (c, json!({"prompt": "a", "logprobs": -1}), 400, "invalid_request_error", Some("logprobs")),
        (c, json!({"prompt": "a", "presence_penalty": 3}), 400, "invalid_request_error", Some("presence_penalty")),
        (c, json!({"prompt": "a", "frequency_penalty": -2.5}), 400, "invalid_request_error", Some("frequency_penalty")),
        (c, json!({"prompt": "a", "repetition_penalty": 0}), 400, "invalid_request_error", Some("repetition_penalty")),
        (c, json!({"prompt": "a", "logit_bias": {"abc": 1}}), 400, "invalid_request_error", Some("logit_bias")),
        (c, json!({"prompt": "a", "logit_bias": {"5": 500}}), 400, "invalid_request_error", Some("logit_bias")),
        (c, json!({"prompt": "a", "logit_bias": {"99999": 1}}), 400, "invalid_request_error", Some("logit_bias")),
        (c, json!({"prompt": "a", "stop": 5}), 400, "invalid_request_error", Some("stop")),
        (c, json!({"prompt": "a", "stop": ["1","2","3","4","5","6","7","8","9"]}), 400, "invalid_request_error", Some("stop")),
        (c, json!({"prompt": "a", "stop_token_ids": [123456]}), 400, "invalid_request_error", Some("stop_token_ids")),
        (c, json!({"prompt": "a", "stream_options": {"include_usage": true}}), 400, "invalid_request_error", Some("stream_options")),
        (c, json!({"prompt": "a", "suffix": "zz"}), 400, "invalid_request_error", Some("suffix")),
        (c, json!({"prompt": "a", "model": "other"}), 404, "not_found_error", Some("model")),
        (c, json!({"prompt": big}), 413, "invalid_request_error", None),
        (chat, json!({"messages": []}), 400, "invalid_request_error", Some("messages")),
        (chat, json!({"messages": "hi"}), 400, "invalid_request_error", Some("messages")),
        (chat, json!({"messages": [{"role": "robot", "content": "x"}]}), 400, "invalid_request_error", Some("messages[0].role")),
        (chat, json!({"messages": [{"role": "user"}]}), 400, "invalid_request_error", Some("messages[0].content")),
        (
            chat,
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            400,
            "invalid_request_error",
            Some("messages[0].content[0]"),
        ),
        (chat, json!({"messages": user, "top_logprobs": 2}), 400, "invalid_request_error", Some("top_logprobs")),
        (chat, json!({"messages": user, "logprobs": true, "top_logprobs": 50}), 400, "invalid_request_error", Some("top_logprobs")),
        (
            chat,
            json!({"messages": user, "max_tokens": 5, "max_completion_tokens": 6}),
            400,
            "invalid_request_error",
            Some("max_completion_tokens"),
        ),
        ("/tokenize", json!({"prompt": "a", "messages": user}), 400, "invalid_request_error", Some("prompt")),
        ("/detokenize", json!({"tokens": [-5]}), 400, "invalid_request_error", Some("tokens[0]")),
        ("/v1/nothing", json!({}), 404, "not_found_error", None),
        (c, json!({"prompt": "a", "max_tokens": "16"}), 400, "invalid_request_error", Some("max_tokens")),
        (c, json!({"prompt": "a", "max_tokens": "9".repeat(5000)}), 400, "invalid_request_error", Some("max_tokens")),
        (c, json!({"prompt": "a", "suffix": "z".repeat(5000)}), 400, "invalid_request_error", Some("suffix")),
        (c, json!({"prompt": "a", "stream": "yes"}), 400, "invalid_request_error", Some("stream")),
        (
            c,
            json!({"prompt": "a", "stream_options": {"include_usage": 1}}),
            400,
            "invalid_request_error",
            Some("stream_options.include_usage"),
        ),
        (c, json!({"prompt": ["a", "b", "c"], "n": 2}), 400, "invalid_request_error", Some("n")),
        (c, json!({"prompt": "a", "response_format": {"type": "xml"}}), 400, "invalid_request_error", Some("response_format.type")),
        (c, json!({"prompt": "a", "guided_json": 42}), 400, "invalid_request_error", Some("guided_json")),
        (
            chat,
            json!({"messages": user, "tools": [{"type": "function", "function": {"name": "f"}}]}),
            400,
            "invalid_request_error",
            Some("tools"),
        ),
        (chat, json!({"messages": user, "tool_choice": "required"}), 400, "invalid_request_error", Some("tool_choice")),
        (chat, json!({"messages": user, "functions": [{"name": "f"}]}), 400, "invalid_request_error", Some("functions")),
        (
            chat,
            json!({"messages": user, "response_format": {"type": "json_schema"}}),
            400,
            "invalid_request_error",
            Some("response_format.json_schema.schema"),
        ),
        (chat, json!({"messages": long_chat}), 400, "invalid_request_error", Some("messages")),
        (chat, json!({"messages": user, "max_completion_tokens": 100}), 400, "invalid_request_error", Some("max_completion_tokens")),
        (chat, json!({"messages": user, "max_completion_tokens": 0}), 400, "invalid_request_error", Some("max_completion_tokens")),
        (chat, json!({"messages": user, "model": "x".repeat(3000)}), 404, "not_found_error", Some("model")),
    ];
    assert!(cases.len() >= 60, "{}", cases.len());
    for (path, body, status, kind, param) in &cases {
        let (st, v) = srv.post(path, body.clone()).await;
        assert_eq!(st, *status, "{path} {body}: {v}");
        assert_eq!(v["error"]["type"], *kind, "{path} {body}: {v}");
        assert_eq!(v["error"]["param"].as_str(), *param, "{path} {body}: {v}");
        // Never an echo of unbounded input.
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty() && m.len() < 600), "{v}");
    }
    // Asking for nothing unserved passes: plain text, no tools.
    let ok = json!({"messages": user, "max_tokens": 2, "response_format": {"type": "text"}, "tools": [], "tool_choice": "none"});
    let (st, v) = srv.post(chat, ok).await;
    assert_eq!(st, 200, "{v}");
    let (_, v) = srv.post(c, json!({"prompt": "a", "model": "other"})).await;
    assert_eq!(v["error"]["code"], "model_not_found", "{v}");
    // A temperature too small to divide by is greedy: the text of temperature 0.
    let mut texts = vec![];
    for t in [1e-39, 0.0] {
        let (st, v) = srv.post(c, json!({"prompt": "The", "max_tokens": 12, "temperature": t, "seed": 1})).await;
        assert_eq!(st, 200, "{v}");
        texts.push(v["choices"][0]["text"].clone());
    }
    assert_eq!(texts[0], texts[1], "temperature 1e-39 against greedy");
    // Malformed JSON and a wrong content type.
    let r =
        srv.client.post(format!("{}{c}", srv.base)).header("content-type", "application/json").body("{\"prompt\": ").send().await.unwrap();
    assert_eq!(r.status(), 400);
    let r = srv.client.post(format!("{}{c}", srv.base)).header("content-type", "text/plain").body("{}").send().await.unwrap();
    assert_eq!(r.status(), 415);
    let r = srv.client.post(format!("{}{c}", srv.base)).body("{}").send().await.unwrap();
    assert_eq!(r.status(), 415, "no Content-Type");
    let r = srv.client.get(format!("{}{c}", srv.base)).send().await.unwrap();
    assert_eq!(r.status(), 405);
    // Messages name field, expected and actual.
    let (_, v) = srv.post(c, json!({"prompt": "a", "top_p": 1.5})).await;
    assert_eq!(v["error"]["message"], "`top_p` must be in (0, 1]; got 1.5");
    assert_eq!(v["error"]["param"], "top_p");
    // The server still serves normally.
    let (st, v) = srv.post(c, json!({"prompt": "a", "max_tokens": 3})).await;
    assert_eq!(st, 200, "{v}");
}

#[tokio::test]
async fn api_key_is_required_when_set() {
    let srv = start(&["--api-key", "sekret"]).await;
    let (st, v) = srv.post("/v1/completions", json!({"prompt": "a", "max_tokens": 1})).await;
    assert_eq!((st, v["error"]["type"].as_str()), (401, Some("authentication_error")));
    let r =
        srv.client.post(format!("{}/v1/completions", srv.base)).bearer_auth("wrong").json(&json!({"prompt": "a"})).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = srv
        .client
        .post(format!("{}/v1/completions", srv.base))
        .bearer_auth("sekret")
        .json(&json!({"prompt": "a", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Probes and metrics need no key.
    assert_eq!(srv.client.get(format!("{}/ready", srv.base)).send().await.unwrap().status(), 200);
    assert_eq!(srv.client.get(format!("{}/metrics", srv.base)).send().await.unwrap().status(), 200);
}

// Shutdown, logs, metrics, sizing, timeouts and splits.
#[path = "http_api/operations.rs"]
mod operations;

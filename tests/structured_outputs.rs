//! Structured outputs through the in-process server on the demo model: JSON schemas,
//! `json_object`, `guided_choice`, `guided_regex` and Lark grammars always hold at temperature 1
//! (the model is tiny: the constraint does the work), streamed or not, and bad grammars get a
//! 400 naming their field within a bound.

#[path = "in_process/mod.rs"]
mod in_process;

use std::time::{Duration, Instant};

use futures::StreamExt;
use in_process::{serve_dir, Setup};
use serde_json::{json, Value};

const CHAT_TEMPLATE: &str =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{{ '<|im_start|>assistant\\n' }}";

async fn demo() -> String {
    let dir = deltaserve_tests::tests_dir().join("../models/gdn-demo");
    let setup = Setup { slots: 16, max_queue: 64, template: Some(CHAT_TEMPLATE), ..Setup::default() };
    serve_dir(&dir, setup).await.0
}

async fn post(client: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    let r = client.post(url).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// Every choice's text of `requests` copies of `body` (each with its own seed), sent together.
async fn texts(client: &reqwest::Client, base: &str, body: Value, requests: u64) -> Vec<(String, String)> {
    let calls = (0..requests).map(|seed| {
        let mut b = body.clone();
        b["seed"] = json!(seed);
        post(client, format!("{base}/v1/completions"), b)
    });
    let mut out = Vec::new();
    for (status, v) in futures::future::join_all(calls).await {
        assert_eq!(status, 200, "{v}");
        for c in v["choices"].as_array().unwrap() {
            out.push((c["text"].as_str().unwrap().to_owned(), c["finish_reason"].as_str().unwrap().to_owned()));
        }
    }
    out
}

fn user_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "role": {"enum": ["admin", "user", "guest"]},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 12}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"],
                "additionalProperties": false
            },
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
            "active": {"type": "boolean"}
        },
        "required": ["name", "age", "role", "address", "tags"],
        "additionalProperties": false
    })
}

#[tokio::test]
async fn fifty_sampled_completions_under_a_json_schema_all_parse_and_validate() {
    let base = demo().await;
    let client = reqwest::Client::new();
    let schema = user_schema();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let body = json!({
        "prompt": "A user record:", "max_tokens": 256, "temperature": 1.0, "n": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "user", "schema": schema}}
    });
    let outs = texts(&client, &base, body, 25).await;
    assert_eq!(outs.len(), 50);
    let mut distinct = std::collections::HashSet::new();
    for (text, finish) in &outs {
        assert_eq!(finish, "stop", "the grammar completes before max_tokens: {text:?}");
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{text}: {errors:?}");
        distinct.insert(text.clone());
    }
    // Temperature 1 really sampled: the outputs differ.
    assert!(distinct.len() > 25, "only {} distinct outputs", distinct.len());
}

#[tokio::test]
async fn guided_choice_regex_and_lark_outputs_always_match() {
    let base = demo().await;
    let client = reqwest::Client::new();
    let choices = ["yes", "no", "maybe later", "a \"quoted\" (one)"];
    let body = json!({"prompt": "Answer:", "max_tokens": 32, "temperature": 1.0, "n": 4, "guided_choice": choices});
    let outs = texts(&client, &base, body, 5).await;
    assert_eq!(outs.len(), 20);
    for (text, finish) in &outs {
        assert!(choices.contains(&text.as_str()), "{text:?}");
        assert_eq!(finish, "stop");
    }
    let rx = r"[A-Z][a-z]{2,6}-[0-9]{3}";
    let full = regex::Regex::new(&format!("^{rx}$")).unwrap();
    let body = json!({"prompt": "Code:", "max_tokens": 32, "temperature": 1.0, "n": 4, "guided_regex": rx});
    for (text, finish) in texts(&client, &base, body, 5).await {
        assert!(full.is_match(&text), "{text:?}");
        assert_eq!(finish, "stop");
    }
    // vLLM's structured_outputs form, with a Lark grammar.
    let lark = "start: \"[\" item (\", \" item)* \"]\"\nitem: /[0-9]{1,3}/";
    let list = regex::Regex::new(r"^\[[0-9]{1,3}(, [0-9]{1,3})*\]$").unwrap();
    let body = json!({"prompt": "Numbers:", "max_tokens": 40, "temperature": 1.0, "n": 4, "structured_outputs": {"grammar": lark}});
    for (text, finish) in texts(&client, &base, body, 3).await {
        if finish == "stop" {
            assert!(list.is_match(&text), "{text:?}");
        } else {
            // Cut by max_tokens: still a prefix the grammar allows.
            assert!(text.starts_with('[') && !text.contains(']'), "{text:?}");
        }
    }
}

#[tokio::test]
async fn chat_json_object_mode_streams_a_json_object() {
    let base = demo().await;
    let client = reqwest::Client::new();
    for seed in 0..4 {
        let body = json!({
            "messages": [{"role": "user", "content": "Give me an object."}],
            "max_tokens": 200, "temperature": 1.0, "seed": seed, "stream": true,
            "response_format": {"type": "json_object"}
        });
        let resp = client.post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let mut text = String::new();
        let mut finish = None;
        let mut buf = String::new();
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            while let Some(end) = buf.find("\n\n") {
                let event: String = buf.drain(..end + 2).collect();
                let data = event.trim().strip_prefix("data: ").unwrap_or("");
                if data.is_empty() || data == "[DONE]" {
                    continue;
                }
                let v: Value = serde_json::from_str(data).unwrap();
                text.push_str(v["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
                if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
                    finish = Some(f.to_owned());
                }
            }
        }
        if finish.as_deref() == Some("stop") {
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
            assert!(v.is_object(), "{text}");
        } else {
            assert_eq!(finish.as_deref(), Some("length"), "{text}");
            assert!(text.starts_with('{'), "{text:?}");
        }
    }
}

#[tokio::test]
async fn bad_grammars_are_refused_naming_their_field_within_a_bound() {
    let base = demo().await;
    let client = reqwest::Client::new();
    let url = format!("{base}/v1/completions");
    let cases = [
        (json!({"guided_json": {"type": "nonsense"}}), "guided_json"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}}, "required": ["a"]}}}}),
            "response_format.json_schema.schema",
        ),
        (json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}), "response_format.json_schema.schema"),
        (json!({"response_format": {"type": "yaml"}}), "response_format.type"),
        (json!({"guided_regex": "(unclosed"}), "guided_regex"),
        (json!({"guided_choice": []}), "guided_choice"),
        (json!({"guided_choice": ["a", 3]}), "guided_choice"),
        (json!({"guided_grammar": "start: undefined_rule"}), "guided_grammar"),
        (json!({"structured_outputs": {"xml": "<a/>"}}), "structured_outputs.xml"),
        (json!({"guided_regex": "a+", "guided_choice": ["a"]}), "guided_choice"),
    ];
    for (extra, field) in cases {
        let mut body = json!({"prompt": "x", "max_tokens": 4});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, v) = post(&client, url.clone(), body.clone()).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], field, "{body}: {v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
    // Too large: a schema of 12,000 required properties, and a Lark grammar nested 28,000
    // rules deep (it overflowed a runtime thread's stack once, aborting the server). Both are
    // refused by llguidance's limits within the compile timeout, with a one-line message.
    let props: serde_json::Map<String, Value> =
        (0..12000).map(|i| (format!("p{i}"), json!({"type": "string", "enum": [format!("v{i}a"), format!("v{i}b")]}))).collect();
    let names: Vec<&String> = props.keys().collect();
    let schema = json!({"type": "object", "properties": props, "required": names});
    let rules: String = (0..28000).map(|i| format!("r{i}: \"a{i}\" r{} | \"b\"\n", i + 1)).collect();
    let lark = format!("start: r0\n{rules}r28000: \"z\"");
    for (field, value) in [("guided_json", schema), ("guided_grammar", Value::String(lark))] {
        let t0 = Instant::now();
        let (status, v) = post(&client, url.clone(), json!({"prompt": "x", "max_tokens": 4, field: value})).await;
        let took = t0.elapsed();
        assert_eq!(status, 400, "{field}: {v}");
        assert_eq!(v["error"]["param"], field);
        let message = v["error"]["message"].as_str().unwrap();
        assert!(!message.contains('\n') && message.len() < 400, "{message}");
        assert!(took < Duration::from_secs(11), "{field} took {took:?}");
    }
    // The server still serves a constrained request afterwards.
    let (status, v) = post(&client, url, json!({"prompt": "x", "max_tokens": 8, "guided_choice": ["ok"]})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], "ok");
}

//! Tool calls and reasoning in `/v1/chat/completions`:
//! - chat templates with tools render exactly what transformers' `apply_chat_template(tools=…)`
//!   renders (goldens made by `tools/make_template_goldens.py` with transformers);
//! - recorded outputs in both Qwen syntaxes (`qwen3_xml`, `hermes`) parse into OpenAI
//!   `tool_calls`, whole and streamed in pieces of every size;
//! - on the demo model, `tool_choice: "required"` and a named function always give well-formed
//!   calls that validate against the tool's schema (the grammar does the work), streamed or
//!   not, and a call → tool result → answer round trip works over loopback, also through the
//!   official `openai` Python client where it is installed.

#[path = "in_process/mod.rs"]
mod in_process;

use std::sync::Arc;

use deltaserve::api::chat::output::{OutputConfig, OutputParser, Parsed, ToolSyntax};
use deltaserve::api::chat::tools::ToolSet;
use deltaserve::api::chat::{parse_messages, ChatTemplate};
use futures::StreamExt;
use in_process::{serve_dir, Setup};
use serde_json::{json, Value};

const XML_TEMPLATE: &str = include_str!("fixtures/templates/xml_tools.jinja");
const HERMES_TEMPLATE: &str = include_str!("fixtures/templates/hermes_tools.jinja");

fn fixture(path: &str) -> Value {
    let p = deltaserve_tests::tests_dir().join("fixtures").join(path);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

#[test]
fn templates_with_tools_render_what_transformers_renders() {
    let goldens = fixture("templates/goldens.json");
    let cases = goldens["cases"].as_array().unwrap();
    assert!(cases.len() >= 7, "{}", goldens["made_by"]);
    for (i, case) in cases.iter().enumerate() {
        let name = case["template"].as_str().unwrap();
        let source = match name {
            "xml_tools.jinja" => XML_TEMPLATE,
            "hermes_tools.jinja" => HERMES_TEMPLATE,
            other => panic!("unknown template {other}"),
        };
        let t = ChatTemplate::new(source, None, None).unwrap();
        let messages = parse_messages(Some(&case["messages"])).unwrap();
        let tools = Some(&case["tools"]).filter(|t| !t.is_null());
        let kwargs = Some(&case["chat_template_kwargs"]).filter(|k| !k.is_null());
        let ours = t.render(&messages, tools, kwargs).unwrap();
        let theirs = case["rendered"].as_str().unwrap();
        if ours != theirs {
            let at = ours.chars().zip(theirs.chars()).take_while(|(a, b)| a == b).count();
            let from = at.saturating_sub(60);
            let show = |s: &str| s.chars().skip(from).take(160).collect::<String>();
            panic!("case {i} ({name}) differs at char {at}:\nours:   {:?}\ntheirs: {:?}", show(&ours), show(theirs));
        }
    }
    assert_eq!(ChatTemplate::new(XML_TEMPLATE, None, None).unwrap().tool_syntax, Some(ToolSyntax::Xml));
    assert_eq!(ChatTemplate::new(HERMES_TEMPLATE, None, None).unwrap().tool_syntax, Some(ToolSyntax::Json));
}

fn config_of(case: &Value, tools: &Arc<ToolSet>) -> OutputConfig {
    let starts = case["starts_thinking"].as_bool().unwrap();
    OutputConfig {
        reasoning: starts || case["reasoning_parser"].as_bool().unwrap_or(false),
        starts_thinking: starts,
        tool_syntax: Some(match case["syntax"].as_str().unwrap() {
            "qwen3_xml" => ToolSyntax::Xml,
            "hermes" => ToolSyntax::Json,
            other => panic!("{other}"),
        }),
        tools: tools.clone(),
    }
}

/// Compares a parse with the sample's expectation (arguments as parsed JSON).
fn check(case: &Value, got: &Parsed, how: &str) {
    let name = case["name"].as_str().unwrap();
    let opt = |s: &str| if s.is_empty() { Value::Null } else { json!(s) };
    assert_eq!(opt(&got.reasoning), case["reasoning"], "{name} ({how}): reasoning");
    assert_eq!(opt(&got.content), case["content"], "{name} ({how}): content");
    let calls: Vec<Value> = got
        .calls
        .iter()
        .map(|(n, a)| {
            let args: Value = serde_json::from_str(a).unwrap_or_else(|e| panic!("{name} ({how}): arguments {a:?} are not JSON: {e}"));
            json!({"name": n, "arguments": args})
        })
        .collect();
    assert_eq!(Value::Array(calls), case["tool_calls"], "{name} ({how}): tool_calls");
}

#[test]
fn recorded_tool_call_outputs_parse_whole_and_streamed() {
    let samples = fixture("tool_calls/samples.json");
    let tools = Arc::new(ToolSet::parse(Some(&samples["tools"])).unwrap());
    for case in samples["cases"].as_array().unwrap() {
        let config = config_of(case, &tools);
        let output = case["output"].as_str().unwrap();
        check(case, &OutputParser::parse_all(config.clone(), output), "whole");
        let chars: Vec<char> = output.chars().collect();
        for size in [1, 2, 3, 5, 8, 13, 40] {
            let mut p = OutputParser::new(config.clone());
            let mut got = Parsed::default();
            for piece in chars.chunks(size) {
                got.absorb(p.push(&piece.iter().collect::<String>()));
            }
            got.absorb(p.finish());
            check(case, &got, &format!("streamed in pieces of {size} chars"));
        }
    }
}

#[test]
fn a_streamed_xml_call_is_announced_before_it_completes() {
    let tools = Arc::new(ToolSet::parse(Some(&fixture("tool_calls/samples.json")["tools"])).unwrap());
    let config = OutputConfig { reasoning: true, starts_thinking: false, tool_syntax: Some(ToolSyntax::Xml), tools };
    let mut p = OutputParser::new(config);
    let first = p.push("<tool_call>\n<function=get_weather>\n");
    assert_eq!(first.calls.len(), 1, "{first:?}");
    assert_eq!(first.calls[0].name.as_deref(), Some("get_weather"));
    let second = p.push("<parameter=city>\nRiga\n</parameter>\n");
    assert_eq!(second.calls[0].arguments, "{\"city\": \"Riga\"");
    let last = p.push("</function>\n</tool_call>");
    assert_eq!(last.calls[0].arguments, "}");
    assert!(p.finish().is_empty());
}

// ---- the demo model behind the in-process server ----

fn demo_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.", "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "units": {"enum": ["metric", "imperial"]},
                "detailed": {"type": "boolean"}
            },
            "required": ["city", "days"]
        }}},
        {"type": "function", "function": {"name": "search", "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "maxLength": 24}, "filters": {"type": "object", "properties": {"site": {"type": "string", "maxLength": 12}}, "required": ["site"], "additionalProperties": false}},
            "required": ["query"]
        }}}
    ])
}

async fn demo(template: &'static str) -> String {
    let dir = deltaserve_tests::tests_dir().join("../models/gdn-demo");
    serve_dir(&dir, Setup { slots: 8, max_queue: 64, template: Some(template), ..Setup::default() }).await.0
}

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let r = client.post(format!("{url}/v1/chat/completions")).json(body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// Every tool call of `message` validates against its tool's parameters.
fn assert_calls_valid(message: &Value, only: Option<&str>) -> usize {
    let tools = demo_tools();
    let calls = message["tool_calls"].as_array().unwrap_or_else(|| panic!("no tool_calls in {message}"));
    assert!(!calls.is_empty());
    for c in calls {
        assert_eq!(c["type"], "function", "{c}");
        assert!(c["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{c}");
        let name = c["function"]["name"].as_str().unwrap();
        if let Some(n) = only {
            assert_eq!(name, n);
        }
        let tool =
            tools.as_array().unwrap().iter().find(|t| t["function"]["name"] == name).unwrap_or_else(|| panic!("unknown tool {name}"));
        let args: Value = serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
        let validator = jsonschema::validator_for(&tool["function"]["parameters"]).unwrap();
        assert!(validator.is_valid(&args), "{name}({args}) breaks its schema");
    }
    calls.len()
}

#[tokio::test]
async fn required_and_named_tool_choices_always_give_valid_calls() {
    for template in [XML_TEMPLATE, HERMES_TEMPLATE] {
        let base = demo(template).await;
        let client = reqwest::Client::new();
        let mut calls = 0;
        for seed in 0..6 {
            // One call, or (the tiny model never chooses to stop calling) calls until the
            // token limit: every complete call is valid either way.
            let parallel = seed % 2 == 0;
            let body = json!({
                "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                "tools": demo_tools(), "tool_choice": "required", "parallel_tool_calls": parallel,
                "temperature": 1.0, "seed": seed, "n": 2, "max_tokens": 300,
                "chat_template_kwargs": {"enable_thinking": false}
            });
            let (status, v) = post(&client, &base, &body).await;
            assert_eq!(status, 200, "{v}");
            for c in v["choices"].as_array().unwrap() {
                let mut m = c["message"].clone();
                if parallel && c["finish_reason"] == "length" {
                    // The last call was cut off by max_tokens.
                    m["tool_calls"].as_array_mut().unwrap().pop();
                } else {
                    assert_eq!(c["finish_reason"], "tool_calls", "{c}");
                }
                let n = assert_calls_valid(&m, None);
                assert!(parallel || n == 1, "{c}");
                calls += n;
            }
        }
        assert!(calls >= 12);
        let named = json!({
            "messages": [{"role": "user", "content": "Find news"}],
            "tools": demo_tools(), "tool_choice": {"type": "function", "function": {"name": "search"}},
            "parallel_tool_calls": false, "temperature": 1.0, "seed": 7, "max_tokens": 400,
            "chat_template_kwargs": {"enable_thinking": false}
        });
        let (status, v) = post(&client, &base, &named).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(assert_calls_valid(&v["choices"][0]["message"], Some("search")), 1);
        assert!(v["choices"][0]["message"]["content"].is_null(), "{v}");
    }
}

#[tokio::test]
async fn auto_tools_beside_a_json_schema_give_calls_or_a_valid_answer() {
    let base = demo(XML_TEMPLATE).await;
    let client = reqwest::Client::new();
    let schema = json!({"type": "object", "properties": {"answer": {"type": "string", "maxLength": 30}, "sure": {"type": "boolean"}}, "required": ["answer", "sure"], "additionalProperties": false});
    let validator = jsonschema::validator_for(&schema).unwrap();
    // The token `{`: biased up, the model takes the answer branch; left alone, it calls.
    let r: Value = client
        .post(format!("{base}/tokenize"))
        .json(&json!({"prompt": "{", "add_special_tokens": false}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let brace = r["tokens"][0].as_u64().unwrap();
    for (bias, want_answers) in [(0.0, false), (30.0, true)] {
        let (mut answers, mut calls) = (0, 0);
        for seed in 0..4 {
            let body = json!({
                "messages": [{"role": "user", "content": "Weather in Lima?"}],
                "tools": demo_tools(), "tool_choice": "auto", "parallel_tool_calls": false,
                "response_format": {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}},
                "logit_bias": {brace.to_string(): bias},
                "temperature": 1.0, "seed": seed, "n": 2, "max_tokens": 200, "chat_template_kwargs": {"enable_thinking": false}
            });
            let (status, v) = post(&client, &base, &body).await;
            assert_eq!(status, 200, "{v}");
            for c in v["choices"].as_array().unwrap() {
                let m = &c["message"];
                if m["tool_calls"].is_array() {
                    assert_eq!(c["finish_reason"], "tool_calls", "{c}");
                    calls += assert_calls_valid(m, None);
                } else {
                    let text = m["content"].as_str().unwrap();
                    let parsed: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
                    assert!(validator.is_valid(&parsed), "{parsed}");
                    answers += 1;
                }
            }
        }
        assert_eq!(answers + calls, 8);
        assert_eq!(answers > 0, want_answers, "bias {bias}: {answers} structured answers, {calls} calls");
    }
}

/// Reads an SSE stream into its chunks.
async fn stream_chunks(client: &reqwest::Client, base: &str, body: &Value) -> Vec<Value> {
    let r = client.post(format!("{base}/v1/chat/completions")).json(body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut text = String::new();
    let mut s = r.bytes_stream();
    while let Some(b) = s.next().await {
        text.push_str(&String::from_utf8_lossy(&b.unwrap()));
    }
    text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect()
}

#[tokio::test]
async fn streamed_tool_calls_arrive_as_openai_deltas_and_match_the_whole_answer() {
    let base = demo(XML_TEMPLATE).await;
    let client = reqwest::Client::new();
    let body = json!({
        "messages": [{"role": "user", "content": "Weather in Oslo and some news"}],
        "tools": demo_tools(), "tool_choice": "required", "parallel_tool_calls": false, "temperature": 1.0, "seed": 3, "max_tokens": 400,
        "chat_template_kwargs": {"enable_thinking": false}
    });
    let (_, whole) = post(&client, &base, &body).await;
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let chunks = stream_chunks(&client, &base, &streamed).await;
    // Rebuild the calls the way the openai SDK does: by index, name from the first piece,
    // arguments concatenated.
    let mut calls: Vec<(String, String, String)> = Vec::new();
    let mut finish = Value::Null;
    for ch in &chunks {
        let choice = &ch["choices"][0];
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
        for piece in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let k = piece["index"].as_u64().unwrap() as usize;
            if k == calls.len() {
                assert!(piece["id"].is_string() && piece["type"] == "function" && piece["function"]["name"].is_string(), "{piece}");
                calls.push((piece["id"].as_str().unwrap().into(), piece["function"]["name"].as_str().unwrap().into(), String::new()));
            } else {
                assert!(k + 1 == calls.len() && piece["id"].is_null(), "pieces of one call arrive together: {piece}");
            }
            calls[k].2.push_str(piece["function"]["arguments"].as_str().unwrap());
        }
    }
    assert_eq!(finish, "tool_calls");
    let whole_calls = whole["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), whole_calls.len());
    for ((id, name, args), w) in calls.iter().zip(whole_calls) {
        // Ids are unique per call: the two requests' differ.
        assert_ne!(w["id"], json!(id));
        assert_eq!(w["function"]["name"], json!(name));
        let a: Value = serde_json::from_str(args).unwrap();
        let b: Value = serde_json::from_str(w["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(a, b);
    }
}

#[tokio::test]
async fn a_tool_result_goes_back_and_the_model_answers() {
    let base = demo(XML_TEMPLATE).await;
    let client = reqwest::Client::new();
    let mut messages = json!([{"role": "system", "content": "You answer about weather."}, {"role": "user", "content": "Weather in Rome?"}]);
    let first = json!({"messages": messages, "tools": demo_tools(), "tool_choice": "required", "parallel_tool_calls": false, "seed": 1, "max_tokens": 300, "chat_template_kwargs": {"enable_thinking": false}});
    let (status, v) = post(&client, &base, &first).await;
    assert_eq!(status, 200, "{v}");
    let assistant = v["choices"][0]["message"].clone();
    let call_id = assistant["tool_calls"][0]["id"].clone();
    messages.as_array_mut().unwrap().push(assistant);
    messages.as_array_mut().unwrap().push(json!({"role": "tool", "tool_call_id": call_id, "content": "{\"temp_c\": 24}"}));
    for choice in ["auto", "none"] {
        let second = json!({"messages": messages, "tools": demo_tools(), "tool_choice": choice, "seed": 2, "max_tokens": 24});
        let (status, v) = post(&client, &base, &second).await;
        assert_eq!(status, 200, "{v}");
        let c = &v["choices"][0];
        assert!(["stop", "length", "tool_calls"].contains(&c["finish_reason"].as_str().unwrap()), "{c}");
        // The prompt opens a <think> block: the tiny model's text is reasoning until it closes.
        let m = &c["message"];
        assert!(m["reasoning_content"].is_string() || m["content"].is_string() || m["tool_calls"].is_array(), "{m}");
        if choice == "none" {
            assert!(m["tool_calls"].is_null(), "{m}");
        }
    }
}

#[tokio::test]
async fn thinking_output_is_split_into_reasoning_content() {
    let base = demo(XML_TEMPLATE).await;
    let client = reqwest::Client::new();
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "seed": 5, "temperature": 1.0});
    let (status, v) = post(&client, &base, &body).await;
    assert_eq!(status, 200, "{v}");
    let m = &v["choices"][0]["message"];
    // Still inside the think block the prompt opened: everything is reasoning.
    assert!(m["reasoning_content"].as_str().is_some_and(|r| !r.is_empty()), "{m}");
    assert!(m["content"].is_null(), "{m}");
    // With thinking off, the prompt closes the block and the text is content.
    let mut off = body.clone();
    off["chat_template_kwargs"] = json!({"enable_thinking": false});
    let (_, v) = post(&client, &base, &off).await;
    let m = &v["choices"][0]["message"];
    assert!(m["reasoning_content"].is_null() && m["content"].is_string(), "{m}");
}

#[tokio::test]
async fn bad_tool_requests_name_the_field() {
    let base = demo(XML_TEMPLATE).await;
    let client = reqwest::Client::new();
    let user = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (
            json!({"messages": user, "tools": demo_tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice.function.name",
        ),
        (json!({"messages": user, "tools": [{"type": "function", "function": {"name": "bad name"}}]}), "tools[0].function.name"),
        (json!({"messages": user, "tools": demo_tools(), "tool_choice": "sometimes"}), "tool_choice"),
        (json!({"messages": user, "tool_choice": "required"}), "tool_choice"),
        (
            json!({"messages": user, "tools": demo_tools(), "tool_choice": "required", "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (json!({"messages": user, "functions": [{"name": "f"}]}), "functions"),
        (
            json!({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{"}}]}]}),
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            json!({"messages": user, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 5, "maximum": 1}}}}}], "tool_choice": "required"}),
            "tools",
        ),
    ];
    for (body, param) in cases {
        let (status, v) = post(&client, &base, &body).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
    }
    // A template without a tool syntax refuses tools rather than ignoring them.
    let plain = demo("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:").await;
    let (status, v) = post(&client, &plain, &json!({"messages": user, "tools": demo_tools()})).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "tools");
}

/// The official `openai` Python client's tools round trip. It runs where the client is
/// installed (`.ci/run` installs it; `DELTASERVE_PYTHON` names the interpreter); elsewhere a
/// NOTICE says so, and the raw-HTTP round trip above covers the same path.
#[tokio::test]
async fn the_openai_python_client_round_trips_tools() {
    let python = std::env::var("DELTASERVE_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_client = std::process::Command::new(&python).args(["-c", "import openai"]).output().is_ok_and(|o| o.status.success());
    if !has_client {
        println!("NOTICE: `{python}` has no `openai` package: the official client's round trip is not run (see .ci/run)");
        assert!(
            std::env::var("DELTASERVE_REQUIRE_OPENAI").is_err(),
            "DELTASERVE_REQUIRE_OPENAI is set but `{python}` cannot import openai"
        );
        return;
    }
    let base = demo(XML_TEMPLATE).await;
    let script = deltaserve_tests::tests_dir().join("openai_tools_client.py");
    let out = tokio::process::Command::new(&python).arg(&script).arg(format!("{base}/v1")).output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "client failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap();
    assert_eq!(report["first_finish_reason"], "tool_calls", "{report}");
    assert_eq!(report["streamed_calls_match"], true, "{report}");
    assert!(report["answer_finish_reason"].is_string(), "{report}");
}

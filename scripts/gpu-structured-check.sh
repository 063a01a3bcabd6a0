#!/usr/bin/env bash
# GPU check of structured outputs and tool calls (needs a CUDA build and a GPU): serves the demo
# model on the GPU and on the CPU with a tool-calling chat template, sends the same concurrent
# requests to both — greedy JSON-schema completions, required tool calls, and unconstrained
# requests in the same decode batches — and checks that every constrained output parses and
# validates, and that the GPU's texts equal the CPU's (its masks are applied on the device).
#
#   scripts/gpu-structured-check.sh [BIN] [MODEL_DIR]
#   (defaults: target/release/deltaserve, models/gdn-demo)
set -euo pipefail
BIN=${1:-target/release/deltaserve}
MODEL=${2:-models/gdn-demo}
LOGS=${LOGS:-$(mktemp -d)}
mkdir -p "$LOGS"
source "$(dirname "$0")/serve-common.sh"

serve cuda 18441 --chat-template tests/fixtures/templates/xml_tools.jinja
serve cpu 18442 --chat-template tests/fixtures/templates/xml_tools.jinja
python3 - <<'PY'
import json, threading, urllib.request

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
          "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}}, "required": ["name", "age", "tags"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 16}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}}}]
NOTHINK = {"chat_template_kwargs": {"enable_thinking": False}}

def requests():
    out = []
    for i in range(8):
        out.append(("/v1/completions", {"prompt": f"# record {i}\n", "max_tokens": 80, "temperature": 0,
                                        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}}))
        out.append(("/v1/chat/completions", dict({"messages": [{"role": "user", "content": f"Weather {i}?"}], "tools": TOOLS,
                                                 "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 80, "temperature": 0}, **NOTHINK)))
        out.append(("/v1/completions", {"prompt": f"def f{i}(x):", "max_tokens": 40, "temperature": 0}))
        # Logprobs keep the model's own logits: this choice is masked on the host.
        out.append(("/v1/completions", {"prompt": f"# item {i}\n", "max_tokens": 60, "temperature": 0, "logprobs": 2,
                                        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}}))
    return out

def post(port, path, body, out, i):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        out[i] = json.load(r)["choices"][0]

def run(port):
    reqs = requests()
    out = [None] * len(reqs)
    ts = [threading.Thread(target=post, args=(port, p, b, out, i)) for i, (p, b) in enumerate(reqs)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    return reqs, out

reqs, gpu = run(18441)
_, cpu = run(18442)
checked = 0
for (path, body), g, c in zip(reqs, gpu, cpu):
    if "response_format" in body:
        v = json.loads(g["text"])
        assert set(v) == {"name", "age", "tags"} and 0 <= v["age"] <= 120 and len(v["name"]) <= 12, v
        checked += 1
    elif "tools" in body:
        calls = g["message"]["tool_calls"]
        args = json.loads(calls[0]["function"]["arguments"])
        assert g["finish_reason"] == "tool_calls" and len(calls) == 1 and 1 <= args["days"] <= 7 and len(args["city"]) <= 16, g
        checked += 1
    text = lambda x: x.get("text") if "text" in x else json.dumps([t["function"] for t in x["message"].get("tool_calls") or []]) + (x["message"].get("content") or "")
    assert text(g) == text(c), f"GPU and CPU differ for {path} {json.dumps(body)[:80]}:\n{text(g)!r}\n{text(c)!r}"
print(f"OK: {checked} constrained outputs valid on the GPU; all {len(reqs)} texts equal the CPU's")
PY

#!/usr/bin/env bash
# GPU serving check (needs a CUDA build and a GPU): serves one model on the GPU and on the CPU,
# sends the same concurrent greedy completions to both over loopback HTTP (so the scheduler
# packs their prefills into one pass and batches their decode steps), and checks that every
# text agrees and that the GPU server counted the prompt tokens in /metrics.
#
#   scripts/gpu-serve-check.sh [BIN] [MODEL_DIR]
#   (defaults: target/release/deltaserve, tests/fixtures/compact/gdn)
set -euo pipefail
BIN=${1:-target/release/deltaserve}
MODEL=${2:-tests/fixtures/compact/gdn}
LOGS=${LOGS:-$(mktemp -d)}
mkdir -p "$LOGS"
source "$(dirname "$0")/serve-common.sh"

serve cuda 18431
serve cpu 18432
python3 - <<'EOF'
import json, threading, urllib.request

prompts = ["def main():", "import os\n", "class Node:", "# comment", "return x +", "for i in range(", "x", "while True:"]

def complete(port, prompt, out, i):
    model = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models"))["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        out[i] = json.load(r)["choices"][0]["text"]

def run(port):
    out = [None] * len(prompts)
    ts = [threading.Thread(target=complete, args=(port, p, out, i)) for i, p in enumerate(prompts)]
    for t in ts: t.start()
    for t in ts: t.join()
    return out

gpu, cpu = run(18431), run(18432)
bad = [(p, g, c) for p, g, c in zip(prompts, gpu, cpu) if g != c]
for p, g in zip(prompts, gpu):
    print(f"{p!r} -> {g!r}")
metrics = urllib.request.urlopen("http://127.0.0.1:18431/metrics").read().decode()
prompt_tokens = [l for l in metrics.splitlines() if l.startswith("deltaserve:prompt_tokens_total")]
print("GPU server:", prompt_tokens, [l for l in metrics.splitlines() if l.startswith("deltaserve:kv_blocks_total")])
assert all(g is not None for g in gpu), "a GPU request failed"
assert not bad, f"GPU and CPU texts differ: {bad}"
assert prompt_tokens and float(prompt_tokens[0].split()[-1]) > 0, "no prompt tokens counted"
print(f"GPU serve check: {len(prompts)} concurrent completions, GPU text == CPU text for all")
EOF

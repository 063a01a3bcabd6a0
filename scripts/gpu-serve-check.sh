#!/usr/bin/env bash
# GPU serving check (needs a CUDA build and a GPU): serves one model on the GPU and on the CPU,
# sends the same concurrent greedy completions to both over loopback HTTP (so the scheduler
# packs their prefills into one pass and batches their decode steps), and checks that every
# text agrees and that the GPU server counted the prompt tokens in /metrics. Then completions
# of two choices each (`n: 2`: the prompt's slot forked, its partly filled KV block copied on
# attention hybrids), every choice against the CPU's.
#
#   [GPU_FLAGS="--tensor-parallel-size 2"] scripts/gpu-serve-check.sh [BIN] [MODEL_DIR]
#   (defaults: target/release/deltaserve, tests/fixtures/compact/gdn; GPU_FLAGS: more flags
#   for the GPU server)
set -euo pipefail
BIN=${1:-target/release/deltaserve}
MODEL=${2:-tests/fixtures/compact/gdn}
LOGS=${LOGS:-$(mktemp -d)}
mkdir -p "$LOGS"
source "$(dirname "$0")/serve-common.sh"

# shellcheck disable=SC2086
serve cuda 18431 ${GPU_FLAGS:-}
serve cpu 18432
python3 - <<'EOF'
import json, threading, urllib.request

prompts = ["def main():", "import os\n", "class Node:", "# comment", "return x +", "for i in range(", "x", "while True:"]

def complete(port, prompt, out, i, n=1):
    model = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models"))["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0, "n": n}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        choices = sorted(json.load(r)["choices"], key=lambda c: c["index"])
        out[i] = choices[0]["text"] if n == 1 else [c["text"] for c in choices]

def run(port, prompts, n=1):
    out = [None] * len(prompts)
    ts = [threading.Thread(target=complete, args=(port, p, out, i, n)) for i, p in enumerate(prompts)]
    for t in ts: t.start()
    for t in ts: t.join()
    return out

gpu, cpu = run(18431, prompts), run(18432, prompts)
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

# Prompts of 20-odd tokens: a fork copies the last, partly filled KV block.
forked = [p * 6 for p in prompts[:4]]
gpu2, cpu2 = run(18431, forked, 2), run(18432, forked, 2)
for p, g in zip(forked, gpu2):
    print(f"n=2 {p[:24]!r}... -> {g!r}")
assert all(g is not None and len(g) == 2 for g in gpu2), "a GPU request of two choices failed"
bad2 = [(p, g, c) for p, g, c in zip(forked, gpu2, cpu2) if g != c]
assert not bad2, f"GPU and CPU choices differ: {bad2}"
print(f"GPU serve check: {len(forked)} concurrent completions of two choices, GPU == CPU for all")
EOF

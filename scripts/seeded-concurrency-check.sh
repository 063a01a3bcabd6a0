#!/usr/bin/env bash
# Seeded concurrency check over loopback HTTP: serves one model, sends 32 seeded sampled
# completions (temperature 0.8) one at a time, then the same 32 at once, twice, and reports how
# many texts or logprobs differ from the one-at-a-time answers. Exits non-zero on any difference
# unless EXPECT_DIFFERENCES=1 (for measuring a mode that is not batch-invariant).
#
#   scripts/seeded-concurrency-check.sh BIN MODEL_DIR [serve flags...]
#   e.g. scripts/seeded-concurrency-check.sh target/release/deltaserve tests/fixtures/compact/gdn \
#          --device cuda --dtype bf16 --batch-invariant
set -euo pipefail
BIN=$1
MODEL=$2
shift 2
PORT=${PORT:-18441}
LOGS=${LOGS:-$(mktemp -d)}
"$BIN" serve --model "$MODEL" --port "$PORT" --max-num-seqs 32 --max-num-batched-tokens 64 "$@" >"$LOGS/serve-$PORT.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do
  if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/ready')" 2>/dev/null; then break; fi
  sleep 0.5
done
PORT=$PORT EXPECT_DIFFERENCES=${EXPECT_DIFFERENCES:-0} python3 - "$MODEL $*" <<'EOF'
import json, os, sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

port, label = os.environ["PORT"], sys.argv[1]
prompts = [f"{i}:" + " x = y + 1;" * (i * 5 % 37) for i in range(32)]

def complete(i):
    body = {"prompt": prompts[i], "max_tokens": 16, "temperature": 0.8, "top_p": 0.95, "seed": 1000 + i,
            "ignore_eos": True, "logprobs": 2}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        c = json.load(r)["choices"][0]
    return c["text"], json.dumps(c["logprobs"])

alone = [complete(i) for i in range(32)]
worst = 0
for round_ in range(2):
    with ThreadPoolExecutor(32) as ex:
        together = list(ex.map(complete, range(32)))
    texts = sum(a[0] != t[0] for a, t in zip(alone, together))
    lps = sum(a[1] != t[1] for a, t in zip(alone, together))
    print(f"{label}: round {round_}: {texts}/32 texts and {lps}/32 logprob lists differ from alone")
    worst = max(worst, texts, lps)
distinct = len({a[0] for a in alone})
print(f"{label}: {distinct} distinct texts of 32 (seeds matter)")
if distinct <= 16 or (worst and os.environ["EXPECT_DIFFERENCES"] != "1"):
    sys.exit(1)
EOF

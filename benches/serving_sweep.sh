#!/usr/bin/env bash
# The serving sweep on a GPU host, in one call: a random bf16 1.39B Gated DeltaNet
# (benches/configs/gdn-1.3b.json, vocabulary 4,096), `deltaserve serve --device cuda`, then `serve_bench` at
# concurrency 1, 8, 32, 64, 128 and 256 (512-token prompts, 256-token outputs, EOS ignored,
# 4·C requests each, at least 32), one JSON per point, and a plot of throughput and latency
# against load (benches/plot_serving.py). Run benches/hf_static.py on the same checkpoint in the
# same call for transformers + fla beside it, then plot again.
#
#   [RATES="2 4 8"] [MODEL=DIR] [TOKENIZER_FROM=DIR] benches/serving_sweep.sh DELTASERVE_BIN SERVE_BENCH_BIN OUT_DIR [CONCURRENCIES...]
set -euo pipefail
BIN=$1 BENCH=$2 OUT=$3
shift 3
LEVELS=${*:-1 8 32 64 128 256}
MODEL=${MODEL:-/tmp/deltaserve-gdn-1.3b-v4096}
mkdir -p "$OUT"
LOGS=$OUT
if [ ! -f "$MODEL/config.json" ]; then
  # The vocabulary cut to the demo tokenizer's 4,096 tokens: every sampled id has a text, so
  # every token is a streamed chunk (ITL per token).
  python3 -c "import json; c = json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size'] = 4096; json.dump(c, open('$OUT/config.json', 'w'))"
  "$BIN" init-random --config "$OUT/config.json" -o "$MODEL" --dtype bf16 --tokenizer-from "${TOKENIZER_FROM:-models/gdn-demo}" >"$OUT/init.log" 2>&1
fi
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
"$BIN" serve --model "$MODEL" --device cuda --dtype bf16 --port 18600 --max-num-seqs 256 --max-model-len 4096 \
  --max-queue 4096 >"$OUT/serve-cuda.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 240); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:18600/ready')" 2>/dev/null && break
  sleep 0.5
done
"$BENCH" --url http://127.0.0.1:18600 --num-prompts 16 --input-len 512 --output-len 32 --max-concurrency 16 --label warmup >/dev/null
for c in $LEVELS; do
  n=$((4 * c)); [ "$n" -lt 32 ] && n=32
  "$BENCH" --url http://127.0.0.1:18600 --num-prompts "$n" --input-len 512 --output-len 256 --max-concurrency "$c" \
    --label deltaserve --json "$OUT/deltaserve-c$c.json" | tail -1 | tee -a "$OUT/table.md"
done
# Poisson arrivals of the chat mix (128–2,048-token prompts, 64–512-token outputs) at each rate
# of $RATES requests a second, 60 requests each.
for r in ${RATES:-}; do
  "$BENCH" --url http://127.0.0.1:18600 --dataset chat --num-prompts 60 --request-rate "$r" --seed 1 \
    --label "deltaserve-chat" --json "$OUT/deltaserve-chat-r$r.json" | tail -1 | tee -a "$OUT/table.md"
done
kill "${pids[@]}" 2>/dev/null || true
wait 2>/dev/null || true
python3 benches/plot_serving.py "$OUT" "$OUT/serving.svg"

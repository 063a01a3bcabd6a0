#!/usr/bin/env bash
# Chunked prefill under running streams, for one or more server builds in one GPU call: each
# build is started, warmed, then 32 streams (128-token prompts, 1,024-token outputs) run alone,
# and again while 16 prompts of 4,096 tokens (16-token outputs) arrive at 2 a second. The
# streams' ITL p99 against the bare decode step is the measure. The streams ask for each token's
# logprob (`--logprobs 0`), so that every token is a chunk of its own: without it the detokenizer
# holds a partial UTF-8 byte token back and sends it with the next, and such a chunk's ITL is
# two steps (a few percent of a random model's tokens: the p99 itself). Each streams row also
# times its ITL from 1.5 s on (`--itl-after-s`, a row of its own): the streams are all decoding by
# then, so their own start-up (32 prompts prefilled while the first streams run) is left out,
# and in the second run the long prompts (from 1 s on) are arriving.
#
#   [MODEL=DIR] benches/long_prompts.sh SERVE_BENCH_BIN OUT_DIR LABEL=DELTASERVE_BIN...
# MODEL defaults to serving_sweep.sh's checkpoint (written by it or by the caller).
set -euo pipefail
BENCH=$1 OUT=$2
shift 2
MODEL=${MODEL:-/tmp/deltaserve-gdn-1.3b-v4096}
mkdir -p "$OUT"
source "$(dirname "$0")/../scripts/serve-common.sh"
port=18800
for pair in "$@"; do
  label=${pair%%=*} bin=${pair#*=}
  port=$((port + 1))
  start_server "$bin" $port "$OUT/serve-$label.log" --model "$MODEL" --device cuda --dtype bf16 --max-num-seqs 256 --max-model-len 8192 --max-queue 4096
  pid=$server_pid
  url=http://127.0.0.1:$port
  "$BENCH" --url $url --num-prompts 32 --input-len 512 --output-len 64 --max-concurrency 32 --label warmup >/dev/null
  "$BENCH" --url $url --num-prompts 32 --input-len 128 --output-len 1024 --max-concurrency 32 --logprobs 0 \
    --itl-after-s 1.5 --label "$label-streams-alone" --json "$OUT/$label-streams-alone.json" | tail -2 | tee -a "$OUT/table.md"
  "$BENCH" --url $url --num-prompts 32 --input-len 128 --output-len 1024 --max-concurrency 32 --logprobs 0 \
    --itl-after-s 1.5 --label "$label-streams-with-4096-prompts" --json "$OUT/$label-streams-with-long.json" | tail -2 >"$OUT/$label-streams.row" &
  streams=$!
  sleep 1
  "$BENCH" --url $url --num-prompts 16 --input-len 4096 --output-len 16 --request-rate 2 --seed 3 \
    --label "$label-long-prompts" --json "$OUT/$label-long-prompts.json" | tail -1 | tee -a "$OUT/table.md"
  wait $streams || true
  cat "$OUT/$label-streams.row" | tee -a "$OUT/table.md"
  kill $pid 2>/dev/null || true
  wait $pid 2>/dev/null || true
done

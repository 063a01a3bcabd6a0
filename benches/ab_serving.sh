#!/usr/bin/env bash
# Two server builds on the same checkpoint in one GPU call, alternating: each is started, warmed
# (16 requests), then timed twice with `serve_bench` at concurrency C (IN_LEN-token prompts,
# OUT_LEN-token outputs, 4·C requests), so builds compare within one run of the GPU. A "build" may
# be a script that runs one binary with other flags.
#
#   [C=64] [IN_LEN=512] [OUT_LEN=256] [ROUNDS=2] [MODEL=DIR] benches/ab_serving.sh BEFORE_BIN AFTER_BIN SERVE_BENCH_BIN OUT_DIR
# MODEL defaults to serving_sweep.sh's checkpoint (written by it on first use).
set -euo pipefail
BEFORE=$1 AFTER=$2 BENCH=$3 OUT=$4
C=${C:-64}
MODEL=${MODEL:-/tmp/deltaserve-gdn-1.3b-v4096}
mkdir -p "$OUT"
source "$(dirname "$0")/../scripts/serve-common.sh"
port=18700
for round in $(seq 1 "${ROUNDS:-2}"); do
  for side in before after; do
    bin=$BEFORE; [ "$side" = after ] && bin=$AFTER
    port=$((port + 1))
    start_server "$bin" $port "$OUT/serve-$side-$round.log" --model "$MODEL" --device cuda --dtype bf16 --max-num-seqs 256 --max-model-len 4096 --max-queue 4096
    pid=$server_pid
    "$BENCH" --url http://127.0.0.1:$port --num-prompts 16 --input-len 512 --output-len 32 --max-concurrency 16 --label warmup >/dev/null
    for run in 1 2; do
      "$BENCH" --url http://127.0.0.1:$port --num-prompts $((4 * C)) --input-len "${IN_LEN:-512}" --output-len "${OUT_LEN:-256}" --max-concurrency "$C" \
        --label "$side-$round-$run" --json "$OUT/$side-$round-$run.json" | tail -1 | tee -a "$OUT/ab.md"
    done
    kill $pid 2>/dev/null || true
    wait $pid 2>/dev/null || true
  done
done

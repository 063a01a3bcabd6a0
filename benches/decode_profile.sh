#!/usr/bin/env bash
# Where a decode step's time goes, in one GPU call: the whole model's captured decode step at
# batch 1, 16 and 64 timed (twice, alternating with another build's gpu_bench when BEFORE names
# one), then one replay of each batch under Nsight Compute, summed by kernel and by kind of work
# (benches/ncu_kernels.py).
#
# Usage: benches/decode_profile.sh GPU_BENCH OUT_DIR
# Env: MODEL_DIR (the random 1.39B checkpoint; written on first use), BEFORE (another gpu_bench).
set -euo pipefail
BENCH=$1
OUT=$2
MODEL=${MODEL_DIR:-/tmp/deltaserve-gdn-1.3b}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)

for run in 1 2; do
  "$BENCH" --model-only --model-dir "$MODEL" > "$OUT/model-$run.md" 2>&1
  if [ -n "${BEFORE:-}" ]; then
    "$BEFORE" --model-only --model-dir "$MODEL" > "$OUT/model-before-$run.md" 2>&1
  fi
done

# The graph step of batch B from a --model-only table ("| B | yes | ms | ...").
step_ms() { awk -F'|' -v b="$1" '$2+0 == b && $3 ~ /yes/ { gsub(/ /, "", $4); print $4; exit }' "$2"; }

for b in 1 16 64; do
  # Kernels serialised; clocks and caches left as they are (METHOD.md).
  ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
    "$BENCH" --profile-decode "$b" --model-dir "$MODEL" > "$OUT/ncu-b$b.csv" 2> "$OUT/ncu-b$b.err" || true
  python3 "$HERE/ncu_kernels.py" "decode step, batch $b" "$OUT/ncu-b$b.csv" "$(step_ms "$b" "$OUT/model-1.md")" \
    > "$OUT/kernels-b$b.md" 2>&1 || true
done

#!/usr/bin/env bash
# Where a prefill's time goes, in one GPU call: the whole model's T=4096 prefill timed
# (`gpu_bench --model-only`), then one bf16-mixer prefill under Nsight Compute, summed by kernel
# and by kind of work (benches/ncu_kernels.py).
#
# Usage: benches/prefill_profile.sh GPU_BENCH OUT_DIR
# Env: MODEL_DIR (the random 1.39B checkpoint; written on first use).
set -euo pipefail
BENCH=$1
OUT=$2
MODEL=${MODEL_DIR:-/tmp/deltaserve-gdn-1.3b}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)

"$BENCH" --model-only --model-dir "$MODEL" > "$OUT/model.md" 2>&1
PREFILL_MS=$(sed -n 's/^prefill B=1, T=4096 (bf16 mixer.*): \([0-9.]*\) ms.*/\1/p' "$OUT/model.md")
# Kernels serialised; clocks and caches left as they are (METHOD.md).
ncu --profile-from-start off --clock-control none --cache-control none \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
  "$BENCH" --profile-prefill --model-dir "$MODEL" > "$OUT/ncu-prefill.csv" 2> "$OUT/ncu-prefill.err" || true
python3 "$HERE/ncu_kernels.py" "prefill T=4096, bf16 mixer" "$OUT/ncu-prefill.csv" "$PREFILL_MS" > "$OUT/kernels-prefill.md" 2>&1 || true

#!/usr/bin/env bash
# Whole-model A/B on one GPU: runs two gpu_bench binaries' `--model-only` section alternately
# (A, B, A, B, ...), so a change's effect on prefill T=4096 and the decode step at batch
# 1/16/64 is read from one run on one machine, not against figures from another day.
#
#   benches/ab_model.sh BEFORE_BIN AFTER_BIN [ROUNDS] [OUT_DIR]
set -euo pipefail
a=$1; b=$2; rounds=${3:-2}; out=${4:-.}
"$a" --model-only --reps 3 >/dev/null   # writes the random 1.39B checkpoint once, warms the GPU
for r in $(seq 1 "$rounds"); do
  for side in before after; do
    bin=$a; [ "$side" = after ] && bin=$b
    echo "## round $r: $side ($bin)"
    "$bin" --model-only 2>&1 | tee "$out/ab-$side-$r.log"
  done
done

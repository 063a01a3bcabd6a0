#!/usr/bin/env bash
# The mixer tables of gpu_bench with fla timed in the same run (on the GPU host):
#   benches/mixer_vs_fla.sh GPU_BENCH_BIN [OUT_DIR]
# Installs fla from the wheels in .whl/ (no network needed; made with `pip download --no-deps
# -d .whl flash-linear-attention==0.6.0 fla-core==0.6.0`) into a private directory, times
# fla's kernels (benches/fla_mixer.py → OUT_DIR/fla_mixer.json), then runs
# `gpu_bench --skip-model --fla-json` so that every "vs fla" ratio comes from this run.
set -euo pipefail
BIN=$1
OUT=${2:-$(mktemp -d)}
mkdir -p "$OUT"
FLA=$(mktemp -d)
pip install --quiet --no-deps --no-index --target "$FLA" .whl/*.whl
PYTHONPATH="$FLA${PYTHONPATH:+:$PYTHONPATH}" python3 benches/fla_mixer.py "$OUT/fla_mixer.json" 2>"$OUT/fla_mixer.log"
"$BIN" --skip-model --fla-json "$OUT/fla_mixer.json" | tee "$OUT/gpu_bench_mixers.md"

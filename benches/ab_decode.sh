#!/usr/bin/env bash
# Decode steps of several builds or settings on one GPU, alternating, so that a change's effect is
# read from one run on one machine: each round runs every variant's gpu_bench once per model, in
# turn, and benches/ab_summary.py prints the ranges over the rounds (ms and % of the roofline).
#
#   [ROUNDS=3] [BATCHES=1,4,16,64] [MODELS="q35 gdn"] [TIMEOUT=90] [PREFILL=0] \
#     benches/ab_decode.sh OUT_DIR NAME=COMMAND [NAME=COMMAND ...]
#
# COMMAND is a gpu_bench binary, after optional VAR=value settings, e.g.
#   base=/tmp/b/gpu_bench new=/tmp/n/gpu_bench "copy=DELTASERVE_DECODE_COPY=1 /tmp/n/gpu_bench"
# Models: q35, the Qwen3.5 layout (`--hybrid-dir $HYBRID_DIR`, built by benches/hybrid_vs_hf.py
# when absent; needs PyTorch and transformers); moe, Qwen3.5-35B-A3B's layer shapes cut to 8
# layers (`--hybrid-dir $MOE_DIR`, built the same way; 15.5 GB); gdn, the random 1.39B
# (`--model-only --graphs-only --model-dir $MODEL_DIR`, written by gpu_bench when absent). Logs go to
# OUT_DIR/{model}-{i}-{NAME}.log and the summary to OUT_DIR/summary.md. A run past TIMEOUT
# seconds leaves its log without steps (the first run on a cold machine may spend it reading
# the checkpoint). PREFILL=1 also times each run's T=4096 prefills (bf16 and near-fp32 mixer),
# which the summary adds as columns.
set -euo pipefail
OUT=$1
shift
[ $# -ge 1 ] || { echo "usage: ab_decode.sh OUT_DIR NAME=COMMAND [NAME=COMMAND ...]" >&2; exit 2; }
ROUNDS=${ROUNDS:-3} BATCHES=${BATCHES:-1,4,16,64} MODELS=${MODELS:-q35 gdn} TIMEOUT=${TIMEOUT:-90}
NO_PREFILL=--no-prefill
[ "${PREFILL:-0}" = 1 ] && NO_PREFILL=
HYBRID_DIR=${HYBRID_DIR:-/tmp/q35} MODEL_DIR=${MODEL_DIR:-/tmp/deltaserve-gdn-1.3b}
MOE_DIR=${MOE_DIR:-/tmp/deltaserve-qwen3_5_moe}
mkdir -p "$OUT"
here=$(cd "$(dirname "$0")" && pwd)
for v in "$@"; do
  case $v in
    *=*) ;;
    *) echo "ab_decode.sh: '$v' is not NAME=COMMAND" >&2; exit 2 ;;
  esac
done
if [[ " $MODELS " == *" q35 "* && ! -f $HYBRID_DIR/config.json ]]; then
  python3 -c "import sys; sys.path.insert(0, '$here'); from hybrid_vs_hf import build; build('$HYBRID_DIR')" >"$OUT/build_q35.log" 2>&1
fi
if [[ " $MODELS " == *" moe "* && ! -f $MOE_DIR/config.json ]]; then
  python3 -c "import sys; sys.path.insert(0, '$here'); from hybrid_vs_hf import build_moe; build_moe('$MOE_DIR')" >"$OUT/build_moe.log" 2>&1
fi
i=0
for model in $MODELS; do
  case $model in
    q35) args=(--hybrid-dir "$HYBRID_DIR" $NO_PREFILL) ;;
    moe) args=(--hybrid-dir "$MOE_DIR" $NO_PREFILL) ;;
    gdn) args=(--model-only $NO_PREFILL --graphs-only --model-dir "$MODEL_DIR") ;;
    *) echo "ab_decode.sh: unknown model '$model' (q35, moe, gdn)" >&2; exit 2 ;;
  esac
  for _ in $(seq 1 "$ROUNDS"); do
    for v in "$@"; do
      i=$((i + 1))
      name=${v%%=*}
      read -ra cmd <<<"${v#*=}"
      timeout "$TIMEOUT" env "${cmd[@]}" "${args[@]}" --batches "$BATCHES" >"$OUT/$model-$i-$name.log" 2>&1 || true
    done
  done
done
python3 "$here/ab_summary.py" "$OUT" | tee "$OUT/summary.md"

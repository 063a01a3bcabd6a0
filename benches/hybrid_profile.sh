#!/usr/bin/env bash
# Where the hybrid's decode step goes, in one GPU call: the Qwen3.5-layout checkpoint written by
# benches/hybrid_vs_hf.py's `build` timed (`gpu_bench --hybrid-dir`), then one replay of the
# captured decode step at batch 1 and at batch 64 under Nsight Compute, summed by kernel and by
# kind of work (benches/ncu_kernels.py).
#
# With --prefill first: the T=4096 bf16-mixer prefill instead of the decode steps.
#
# Usage: benches/hybrid_profile.sh [--prefill] GPU_BENCH HYBRID_DIR OUT_DIR
set -euo pipefail
PREFILL=0
if [ "${1:-}" = --prefill ]; then PREFILL=1; shift; fi
BENCH=$1
DIR=$2
OUT=$3
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)

"$BENCH" --hybrid-dir "$DIR" > "$OUT/hybrid.log" 2>&1
# The step's ms from an `OURS {"what": "decode", "batch": B, ...}` line.
step_ms() {
  python3 -c 'import json, sys
for l in open(sys.argv[2]):
    if l.startswith("OURS "):
        r = json.loads(l[5:])
        if r.get("what") == "decode" and r.get("batch") == int(sys.argv[1]):
            print(r["ms"]); break' "$1" "$OUT/hybrid.log"
}
if [ $PREFILL = 1 ]; then
  ms=$(python3 -c 'import json, sys
for l in open(sys.argv[1]):
    if l.startswith("OURS "):
        r = json.loads(l[5:])
        if r.get("what") == "prefill" and r.get("algo") == "ChunkedBf16":
            print(r["ms"]); break' "$OUT/hybrid.log")
  ncu --profile-from-start off --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
    "$BENCH" --hybrid-dir "$DIR" --batches 1 --reps 3 --profile-hybrid-prefill > "$OUT/ncu-prefill.csv" 2> "$OUT/ncu-prefill.err" || true
  python3 "$HERE/ncu_kernels.py" "hybrid prefill T=4096, bf16 mixer" "$OUT/ncu-prefill.csv" "$ms" \
    > "$OUT/kernels-prefill.md" 2>&1 || true
  exit 0
fi
for b in 1 64; do
  # Kernels serialised; clocks and caches left as they are (METHOD.md).
  ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
    "$BENCH" --hybrid-dir "$DIR" --reps 3 --profile-hybrid-decode "$b" > "$OUT/ncu-b$b.csv" 2> "$OUT/ncu-b$b.err" || true
  python3 "$HERE/ncu_kernels.py" "hybrid decode step, batch $b" "$OUT/ncu-b$b.csv" "$(step_ms "$b")" \
    > "$OUT/kernels-b$b.md" 2>&1 || true
done

#!/bin/bash
# Call 5: the small-batch GEMV's K split (DELTASERVE_GEMV_SPLITS forces it for every GEMV; unset:
# the launcher's choice, d) at batch 1 and 2, HEAD's gpu_bench (7e2efdb), alternating, two rounds:
# the Qwen3.5 layout, then the 1.39B.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/head.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run5.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
M=/tmp/gdn13
timeout 60 /tmp/n/gpu_bench_head --model-only --no-prefill --graphs-only --model-dir $M > /dev/null 2>&1
run() { if [ $1 = d ]; then "${@:2}"; else DELTASERVE_GEMV_SPLITS=$1 "${@:2}"; fi; }
for r in 1 2; do
  for s in d 1 2 4 8; do
    run $s timeout 30 /tmp/n/gpu_bench_head --hybrid-dir /tmp/q35 --no-prefill --batches 1,2 > $L/q35-$s-$r.log 2>&1
    echo "q35 splits $s: $(grep -o '"batch":[0-9]*\|"ms":[0-9.]*' $L/q35-$s-$r.log | tr '\n' ' ')"
  done
  for s in d 1 2 4 8; do
    run $s timeout 25 /tmp/n/gpu_bench_head --model-only --no-prefill --graphs-only --model-dir $M --batches 1,2 > $L/model-$s-$r.log 2>&1
    echo "gdn splits $s: $(grep -E '^\| [0-9]+ \| yes' $L/model-$s-$r.log | awk -F'|' '{printf "%s:%s (%s) ", $2, $4, $7}')"
  done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

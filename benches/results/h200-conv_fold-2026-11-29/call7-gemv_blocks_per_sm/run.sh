#!/bin/bash
# Call 7: the small-batch GEMV's blocks-an-SM target, which sets its K split per shape
# (DELTASERVE_GEMV_BLOCKS_PER_SM; 3 the default: 2,048 rows split in 4, 1 in 2, 6 in 8), at batch 1
# and 2, alternating, two rounds: the Qwen3.5 layout, then the 1.39B.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/bps.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run7.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
M=/tmp/gdn13
timeout 60 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M > /dev/null 2>&1
for r in 1 2; do
  for s in 3 1 6; do
    DELTASERVE_GEMV_BLOCKS_PER_SM=$s timeout 30 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches 1,2 > $L/q35-$s-$r.log 2>&1
    echo "q35 per_sm $s: $(grep -o '"batch":[0-9]*\|"ms":[0-9.]*' $L/q35-$s-$r.log | tr '\n' ' ')"
  done
  for s in 3 1 6; do
    DELTASERVE_GEMV_BLOCKS_PER_SM=$s timeout 25 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 1,2 > $L/model-$s-$r.log 2>&1
    echo "gdn per_sm $s: $(grep -E '^\| [0-9]+ \| yes' $L/model-$s-$r.log | awk -F'|' '{printf "%s:%s (%s) ", $2, $4, $7}')"
  done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

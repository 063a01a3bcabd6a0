#!/bin/bash
# Device call: L2 prefetch of o_proj before the mixer core, on (max rows 8) against off, one binary.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/build_q35.log 2>&1) &
BUILD=$!
M=/tmp/gdn13
G="--model-only --no-prefill --graphs-only --model-dir $M"
timeout 150 /tmp/b/gpu_bench $G --batches 1 > $L/model-warm.log 2>&1
for r in 1 2; do
  for v in 0 8; do echo "## round $r max_rows=$v" >> $L/model.log; DELTASERVE_L2_PREFETCH_MAX_ROWS=$v timeout 100 /tmp/b/gpu_bench $G --batches 1,2,4,8,16 >> $L/model.log 2>&1; done
done
for v in 0 64; do echo "## max_rows=$v" >> $L/model.log; DELTASERVE_L2_PREFETCH_MAX_ROWS=$v timeout 100 /tmp/b/gpu_bench $G --batches 16,64 >> $L/model.log 2>&1; done
wait $BUILD
H="--hybrid-dir /tmp/q35 --no-prefill"
for r in 1 2; do
  for v in 0 8; do echo "## round $r max_rows=$v" >> $L/hybrid.log; DELTASERVE_L2_PREFETCH_MAX_ROWS=$v timeout 100 /tmp/b/gpu_bench $H --batches 1,2,4,8 >> $L/hybrid.log 2>&1; done
done
for v in 0 64; do echo "## max_rows=$v" >> $L/hybrid.log; DELTASERVE_L2_PREFETCH_MAX_ROWS=$v timeout 100 /tmp/b/gpu_bench $H --batches 16,64 >> $L/hybrid.log 2>&1; done
for s in 4 8; do echo "## attn splits $s" >> $L/hybrid.log; DELTASERVE_ATTN_SPLITS=$s timeout 100 /tmp/b/gpu_bench $H --batches 1 >> $L/hybrid.log 2>&1; done
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
tail -2 $L/gpu_tests.log
cat $L/gpu.txt; grep -E "^## |copy bandwidth|^\| [0-9]" $L/model.log
grep -E "^## |decode" $L/hybrid.log | sed 's/"batch_invariant":false,//; s/"captured":\[[0-9]*\],"context":256,//; s/,"weight_bytes".*//'
tar -C $L -czf $OUT/pf.tgz .

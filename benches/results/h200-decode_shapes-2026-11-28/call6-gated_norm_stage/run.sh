#!/bin/bash
# Device call 6: the gated norm + o_proj kernel with its inputs copied into shared memory first
# (batch 1), against HEAD's build and the same build with it off; Qwen3.5's 32 head rows fused too.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/build_q35.log 2>&1) &
BUILD=$!
M=/tmp/gdn13
G="--model-only --no-prefill --graphs-only --model-dir $M --batches 1,2"
timeout 150 /tmp/b/gpu_bench.new $G --batches 1 > $L/model-warm.log 2>&1
for r in 1 2; do
  echo "## round $r main" >> $L/model.log; timeout 100 /tmp/b/gpu_bench.main $G >> $L/model.log 2>&1
  echo "## round $r new" >> $L/model.log; timeout 100 /tmp/b/gpu_bench.new $G >> $L/model.log 2>&1
  echo "## round $r new DELTASERVE_GATED_NORM_STAGE=0" >> $L/model.log; DELTASERVE_GATED_NORM_STAGE=0 timeout 100 /tmp/b/gpu_bench.new $G >> $L/model.log 2>&1
done
wait $BUILD
H="--hybrid-dir /tmp/q35 --no-prefill --batches 1"
for r in 1 2; do
  echo "## round $r main" >> $L/hybrid.log; timeout 100 /tmp/b/gpu_bench.main $H >> $L/hybrid.log 2>&1
  echo "## round $r new" >> $L/hybrid.log; timeout 100 /tmp/b/gpu_bench.new $H >> $L/hybrid.log 2>&1
  echo "## round $r new DELTASERVE_GATED_NORM_MAX_ROWS=32" >> $L/hybrid.log; DELTASERVE_GATED_NORM_MAX_ROWS=32 timeout 100 /tmp/b/gpu_bench.new $H >> $L/hybrid.log 2>&1
done
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests.new > $L/gpu_tests.log 2>&1
tail -1 $L/gpu_tests.log; grep -h "FAIL\|panicked\|gated norm folded" $L/gpu_tests.log | head -10
grep -E "^## |^\| [0-9]" $L/model.log
grep -E "^## |decode" $L/hybrid.log | sed 's/"batch_invariant":false,//; s/"captured":\[[0-9]*\],"context":256,//; s/,"weight_bytes".*//; s/OURS //'
tar -C $L -czf $OUT/gs.tgz .

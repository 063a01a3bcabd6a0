#!/bin/bash
# Device call 4: the pipelined decode step (next tile's state streamed into shared memory during
# this tile's step), chosen by DELTASERVE_DECODE_KERNEL, against the default; GPU suite with it.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/build_q35.log 2>&1) &
BUILD=$!
M=/tmp/gdn13
G="--model-only --no-prefill --graphs-only --model-dir $M --batches 16,64"
timeout 150 /tmp/b/gpu_bench.new $G --batches 1 > $L/model-warm.log 2>&1
for r in 1 2; do
  for k in default w16_r16_c2_b2_pipe w16_r16_c2_b1_pipe; do
    echo "## round $r $k" >> $L/model.log
    if [ $k = default ]; then timeout 100 /tmp/b/gpu_bench.new $G >> $L/model.log 2>&1
    else DELTASERVE_DECODE_KERNEL=$k timeout 100 /tmp/b/gpu_bench.new $G >> $L/model.log 2>&1; fi
  done
done
wait $BUILD
H="--hybrid-dir /tmp/q35 --no-prefill --batches 16,64"
for r in 1 2; do
  for k in default w16_r8_c4_b2_pipe w16_r8_c4_b1_pipe w16_r16_c2_b2_pipe; do
    echo "## round $r $k" >> $L/hybrid.log
    if [ $k = default ]; then timeout 100 /tmp/b/gpu_bench.new $H >> $L/hybrid.log 2>&1
    else DELTASERVE_DECODE_KERNEL=$k timeout 100 /tmp/b/gpu_bench.new $H >> $L/hybrid.log 2>&1; fi
  done
done
DELTASERVE_DECODE_KERNEL=w16_r16_c2_b2_pipe DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests.new > $L/gpu_tests-pipe256.log 2>&1
DELTASERVE_DECODE_KERNEL=w16_r8_c4_b2_pipe DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests.new decode graphs models_match > $L/gpu_tests-pipe128.log 2>&1
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests.new > $L/gpu_tests.log 2>&1
for f in $L/gpu_tests*.log; do echo "$f: $(tail -1 $f)"; done
grep -h "FAIL\|panicked" $L/gpu_tests*.log | head -10
grep -E "^## |^\| [0-9]" $L/model.log
grep -E "^## |decode" $L/hybrid.log | sed 's/"batch_invariant":false,//; s/"captured":\[[0-9]*\],"context":256,//; s/,"weight_bytes".*//; s/OURS //'
tar -C $L -czf $OUT/pipe.tgz .

#!/bin/bash
# Device call 2: main against this build (attention combine with the gate, q loads; decode shapes).
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/build_q35.log 2>&1) &
BUILD=$!
M=/tmp/gdn13
G="--model-only --no-prefill --graphs-only --model-dir $M"
timeout 150 /tmp/b/gpu_bench.new $G --batches 1 > $L/model-warm.log 2>&1
for r in 1 2; do
  for v in main new; do echo "## round $r $v" >> $L/model.log; timeout 100 /tmp/b/gpu_bench.$v $G >> $L/model.log 2>&1; done
done
for k in w16_r16_c2_b2 w8_r32_c1_b4; do
  echo "## new DELTASERVE_DECODE_KERNEL=$k" >> $L/model.log; DELTASERVE_DECODE_KERNEL=$k timeout 100 /tmp/b/gpu_bench.new $G --batches 16,64 >> $L/model.log 2>&1
done
wait $BUILD
H="--hybrid-dir /tmp/q35 --no-prefill"
for r in 1 2; do
  for v in main new; do echo "## round $r $v" >> $L/hybrid.log; timeout 100 /tmp/b/gpu_bench.$v $H --batches 1,16,64 >> $L/hybrid.log 2>&1; done
done
for k in w8_r16_c2_b4 w4_r32_c1_b8 w16_r16_c2_b2 w8_r32_c1_b4; do
  echo "## new DELTASERVE_DECODE_KERNEL=$k" >> $L/hybrid.log; DELTASERVE_DECODE_KERNEL=$k timeout 100 /tmp/b/gpu_bench.new $H --batches 16,64 >> $L/hybrid.log 2>&1
done
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests.new > $L/gpu_tests.log 2>&1
tail -2 $L/gpu_tests.log; grep -i "paged attention" $L/gpu_tests.log | head -20
grep -E "^## |copy bandwidth|^\| [0-9]" $L/model.log
grep -E "^## |decode" $L/hybrid.log | sed 's/"batch_invariant":false,//; s/"captured":\[[0-9]*\],"context":256,//; s/,"weight_bytes".*//'
tar -C $L -czf $OUT/ab.tgz .

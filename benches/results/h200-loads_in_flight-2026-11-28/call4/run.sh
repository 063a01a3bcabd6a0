#!/bin/bash
# Device call: main vs new vs new2 (HEAD staged prologue; attention, conv, small-batch step, norms and staged prologues: loads in flight).
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/build_q35.log 2>&1) &
BUILD=$!
M=/tmp/gdn13
G="--model-only --no-prefill --graphs-only --model-dir $M --batches 1,2,4,8,16,64"
timeout 150 /tmp/b/gpu_bench.main --model-only --no-prefill --graphs-only --model-dir $M --batches 1 > $L/model-warm.log 2>&1
for r in 1 2; do
  for v in main new new2; do echo "## round $r $v" >> $L/model.log; timeout 100 /tmp/b/gpu_bench.$v $G >> $L/model.log 2>&1; done
done
wait $BUILD
H="--hybrid-dir /tmp/q35 --no-prefill --batches 1,2,8,16,64"
for r in 1 2; do
  for v in main new new2; do echo "## round $r $v" >> $L/hybrid.log; timeout 100 /tmp/b/gpu_bench.$v $H >> $L/hybrid.log 2>&1; done
done
for v in main new2; do echo "## $v" >> $L/mlp.log; timeout 100 /tmp/b/gpu_bench.$v --attention-only >> $L/mlp.log 2>&1; done
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
tail -2 $L/gpu_tests.log; grep -E "FAIL|panicked" $L/gpu_tests.log | head
cat $L/gpu.txt; grep -E "^## |^\| [0-9]" $L/model.log
grep -E "^## |decode" $L/hybrid.log | sed 's/"batch_invariant":false,//; s/"captured":\[[0-9]*\],"context":256,//; s/,"weight_bytes".*//'
grep -E "^## |OURS" $L/mlp.log
tar -C $L -czf $OUT/ld4.tgz .

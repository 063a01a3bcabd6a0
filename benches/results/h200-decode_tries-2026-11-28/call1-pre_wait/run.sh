#!/bin/bash
# Device call: W (and the decode state) loaded before griddepcontrol.wait: pre (W step 1 in registers for plain GEMVs, L2 prefetch for staged), l2 (L2 prefetch everywhere), trig (pre + trigger after the W loop), against main.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/build_q35.log 2>&1) &
BUILD=$!
DELTASERVE_TESTS_DIR=$PWD/tests timeout 120 /tmp/b/gpu_tests gpu_decode_graphs_equal_eager_decode > $L/gpu_graph_test.log 2>&1
tail -1 $L/gpu_graph_test.log
M=/tmp/gdn13
G="--model-only --no-prefill --graphs-only --model-dir $M --batches 1,2,4,8,16,64"
timeout 150 /tmp/b/gpu_bench.main --model-only --no-prefill --graphs-only --model-dir $M --batches 1 > $L/model-warm.log 2>&1
for r in 1 2; do for v in main pre l2 trig; do
  echo "## round $r $v" >> $L/model.log; timeout 100 /tmp/b/gpu_bench.$v $G >> $L/model.log 2>&1
done; done
wait $BUILD
H="--hybrid-dir /tmp/q35 --no-prefill --batches 1,2,8,16,64"
for r in 1 2; do for v in main pre l2 trig; do
  echo "## round $r $v" >> $L/hybrid.log; timeout 100 /tmp/b/gpu_bench.$v $H >> $L/hybrid.log 2>&1
done; done
grep -E "^## |^\| [0-9]" $L/model.log
grep -E "^## |decode" $L/hybrid.log | sed 's/"batch_invariant":false,//; s/"captured":\[[0-9]*\],"context":256,//; s/,"roofline_ms".*//; s/"graph":"[^"]*",//'
tar -C $L -czf $OUT/early.tgz .

#!/bin/bash
# Device call: graphs rebuilt without memory nodes, programmatic edges (PDL) between our kernels.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/build_q35.log 2>&1) &
BUILD=$!
DELTASERVE_TESTS_DIR=$PWD/tests timeout 120 /tmp/b/gpu_tests gpu_decode_graphs_equal_eager_decode > $L/gpu_graph_test.log 2>&1
tail -2 $L/gpu_graph_test.log; grep -E "panicked" -A2 $L/gpu_graph_test.log | head -5
M=/tmp/gdn13
G="--model-only --no-prefill --graphs-only --model-dir $M --batches 1,2,4,8,16,64"
timeout 150 /tmp/b/gpu_bench.main --model-only --no-prefill --graphs-only --model-dir $M --batches 1 > $L/model-warm.log 2>&1
for r in 1 2; do
  echo "## round $r main" >> $L/model.log; timeout 100 /tmp/b/gpu_bench.main $G >> $L/model.log 2>&1
  echo "## round $r pdl" >> $L/model.log; timeout 100 /tmp/b/gpu_bench.new $G >> $L/model.log 2>&1
  [ $r = 1 ] && { echo "## round $r rebuild-nopdl" >> $L/model.log; DELTASERVE_GRAPH_PDL=0 timeout 100 /tmp/b/gpu_bench.new $G >> $L/model.log 2>&1; }
done
wait $BUILD
H="--hybrid-dir /tmp/q35 --no-prefill --batches 1,2,8,16,64"
for r in 1 2; do
  echo "## round $r main" >> $L/hybrid.log; timeout 100 /tmp/b/gpu_bench.main $H >> $L/hybrid.log 2>&1
  echo "## round $r pdl" >> $L/hybrid.log; timeout 100 /tmp/b/gpu_bench.new $H >> $L/hybrid.log 2>&1
  [ $r = 1 ] && { echo "## round $r rebuild-nopdl" >> $L/hybrid.log; DELTASERVE_GRAPH_PDL=0 timeout 100 /tmp/b/gpu_bench.new $H >> $L/hybrid.log 2>&1; }
done
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
tail -1 $L/gpu_tests.log; grep -E "panicked" -A2 $L/gpu_tests.log | head
cat $L/gpu.txt; grep -E "^## |^\| [0-9]|^batch (1|8|64):" $L/model.log
grep -E "^## |decode" $L/hybrid.log | sed 's/"batch_invariant":false,//; s/"captured":\[[0-9]*\],"context":256,//; s/,"weight_bytes".*//'
tar -C $L -czf $OUT/pdl.tgz .

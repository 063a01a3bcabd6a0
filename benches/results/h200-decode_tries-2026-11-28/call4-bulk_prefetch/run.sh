#!/bin/bash
# Device call: each warp's W rows prefetched into L2 by one bulk request (cp.async.bulk.prefetch.L2) before its loop: in gemv() after the wait and prologue (bulk), or at entry before the wait (bulkent), against base.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/build_q35.log 2>&1) &
BUILD=$!
M=/tmp/gdn13
G="--model-only --no-prefill --graphs-only --model-dir $M --batches 1,2,4,8"
timeout 150 /tmp/b/gpu_bench.base --model-only --no-prefill --graphs-only --model-dir $M --batches 1 > $L/model-warm.log 2>&1
for r in 1 2; do for v in base bulk bulkent; do
  echo "## round $r $v" >> $L/model.log; timeout 100 /tmp/b/gpu_bench.$v $G >> $L/model.log 2>&1
done; done
wait $BUILD
H="--hybrid-dir /tmp/q35 --no-prefill --batches 1,2,8"
for r in 1 2; do for v in base bulk bulkent; do
  echo "## round $r $v" >> $L/hybrid.log; timeout 100 /tmp/b/gpu_bench.$v $H >> $L/hybrid.log 2>&1
done; done
grep -E "^## |^\| [0-9]" $L/model.log
grep -E "^## |decode" $L/hybrid.log | sed 's/"batch_invariant":false,//; s/"captured":\[[0-9]*\],"context":256,//; s/,"roofline_ms".*//; s/"graph":"[^"]*",//'
tar -C $L -czf $OUT/bulk.tgz .

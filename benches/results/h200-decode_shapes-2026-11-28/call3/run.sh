#!/bin/bash
# Device call 3: main against this build (K=256 decode shape at larger batches, attention combine
# with the gate), the fused step at batch 64 as an option, the GPU suite, a batch-64 profile.
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
  echo "## round $r new DELTASERVE_FUSED_STEP_MAX_BATCH=64" >> $L/model.log; DELTASERVE_FUSED_STEP_MAX_BATCH=64 timeout 100 /tmp/b/gpu_bench.new $G --batches 16,64 >> $L/model.log 2>&1
done
wait $BUILD
H="--hybrid-dir /tmp/q35 --no-prefill"
for r in 1 2; do
  for v in main new; do echo "## round $r $v" >> $L/hybrid.log; timeout 100 /tmp/b/gpu_bench.$v $H --batches 1,16,64 >> $L/hybrid.log 2>&1; done
done
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests.new > $L/gpu_tests.log 2>&1
NCU="ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw"
timeout 120 $NCU /tmp/b/gpu_bench.new --model-dir $M --reps 3 --profile-decode 64 > $L/ncu-gdn-b64.csv 2> $L/ncu-gdn-b64.err
python3 benches/ncu_kernels.py "1.39B decode step, batch 64" $L/ncu-gdn-b64.csv > $L/kernels-gdn-b64.md 2>&1
tail -2 $L/gpu_tests.log; grep -i "raw\|K=256" $L/gpu_tests.log | head -20
grep -E "^## |copy bandwidth|^\| [0-9]" $L/model.log
grep -E "^## |decode" $L/hybrid.log | sed 's/"batch_invariant":false,//; s/"captured":\[[0-9]*\],"context":256,//; s/,"weight_bytes".*//'
sed -n 1,30p $L/kernels-gdn-b64.md | cut -c1-120
tar -C $L -czf $OUT/ab2.tgz .

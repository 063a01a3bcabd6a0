#!/bin/bash
# Call 5: one staged row over a vocabulary-tall projection through the looping entry on a capped
# grid (add_norm_gemv_loop_*_b1): its GPU test, then the Qwen3.5 layout's batch-1 step with the
# loop off (0) and at 4, 6, 8 blocks an SM, alternating, two rounds.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/loop.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run5.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1) &
BUILD=$!
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/b/gpu_tests norm > $L/gpu_tests-norm.log 2>&1
echo "gpu_tests norm rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests:|folded" $L/gpu_tests-norm.log; grep -E "panicked|FAILED" -A5 $L/gpu_tests-norm.log | head -20
wait $BUILD; echo "build rc=$?"
for r in 1 2; do for v in 0 4 6 8; do
  s=$(date +%s)
  DELTASERVE_STAGED_B1_LOOP_BLOCKS=$v timeout 90 /tmp/b/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches 1 > $L/q35-$v-$r.log 2>&1
  echo "loop=$v r$r rc=$? $(( $(date +%s) - s )) s $(grep -o '"what":"decode","batch":1[^}]*' $L/q35-$v-$r.log | head -1)"
done; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# The final build (b141: the sigmoid's flush-to-zero forms and the fused conv + prep): the GPU
# suite; then T=4096 prefills (bf16 and near-fp32 mixer) and decode steps at batch 1 and 16
# against b138 with the conv and prep apart (HEAD's kernels), alternating, two rounds, both models.
L=$OUT/logs; mkdir -p $L /tmp/o /tmp/n
tar -C /tmp/o -xJf .devbuild/b138.tar.xz; tar -C /tmp/n -xJf .devbuild/b141.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:" $L/gpu_tests.log | head -20
PREFILL=1 MODELS="gdn q35" ROUNDS=2 BATCHES=1,16 TIMEOUT=90 timeout 420 bash benches/ab_decode.sh $L/ab \
  "base=DELTASERVE_CONV_PREP=0 /tmp/o/gpu_bench" "new=/tmp/n/gpu_bench" > $L/ab.log 2>&1; echo "ab rc $? at ${SECONDS}s"
cat $L/ab/summary.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

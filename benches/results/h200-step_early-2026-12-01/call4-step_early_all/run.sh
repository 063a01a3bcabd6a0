#!/usr/bin/env bash
# The early decode step (the conv lets the raw step start at its entry; the step loads its state
# before it waits): the GPU suite, then decode steps with it off / on to 16 rows / on to 64 rows,
# alternating, two rounds, both models.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t124.tar.xz; tar -C /tmp/n -xJf .devbuild/b124.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 230 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:" $L/gpu_tests.log | head -20; grep -a "early decode step" $L/gpu_tests.log | head -12
MODELS="gdn q35" ROUNDS=2 BATCHES=4,8,16,64 TIMEOUT=70 timeout $((585 - SECONDS)) bash benches/ab_decode.sh $L/ab \
  "off=DELTASERVE_STEP_EARLY=0 /tmp/n/gpu_bench" "on=/tmp/n/gpu_bench" "r64=DELTASERVE_STEP_EARLY_ROWS=64 /tmp/n/gpu_bench" > $L/ab.log 2>&1; echo "ab rc $? at ${SECONDS}s"
cat $L/ab/summary.md
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

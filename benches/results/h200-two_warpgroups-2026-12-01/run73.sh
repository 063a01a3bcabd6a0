#!/usr/bin/env bash
# The GPU suite on the final build (the two-warpgroup test counting its launches).
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/k26.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
SECONDS=0
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? in ${SECONDS}s"
grep -E "GPU tests:|FAILED|panicked" $L/gpu_tests.log | head; grep -E "two-warpgroup" $L/gpu_tests.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# The GPU suite on the final build.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/k20.tar.xz
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1; echo "gpu tests rc $?"
grep -E "GPU tests:|FAILED|panicked" $L/gpu_tests.log | head; grep "warpgroup pass n=" $L/gpu_tests.log

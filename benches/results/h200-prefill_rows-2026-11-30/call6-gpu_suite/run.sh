#!/bin/bash
# Prefill row kernels, call 6: the GPU suite on the final commit's test binary (every test of
# tests/gpu.rs but tensor parallelism, which needs two GPUs).
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t4.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run23.sh $L/run.sh
s=$(date +%s)
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
echo "$(echo $T | wc -w) tests"
DELTASERVE_TESTS_DIR=$PWD/tests timeout 280 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked" $L/gpu_tests.log | tail -5
cd $OUT && tar czf logs.tgz logs && rm -rf logs

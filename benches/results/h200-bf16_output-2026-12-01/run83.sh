#!/usr/bin/env bash
# The final build's GPU suite (the empty pass as Tensor::zeros).
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t33.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 300 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? in ${SECONDS}s"
grep -E "^test .*(ok|FAILED)$|panicked" $L/gpu_tests.log | sort | uniq -c | sort -rn | head -5; grep -c "^test .* ok$" $L/gpu_tests.log; grep -a "ChunkedBf16: mixed\|FAILED" $L/gpu_tests.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# MoE models' prefill and mixed passes as CUDA graphs too (b152): the GPU suite (the graph tests
# now take every compact fixture, Qwen3-Next and Qwen3.5-MoE included).
L=$OUT/logs; mkdir -p $L /tmp/n; cp .devbuild/run152.sh $L/run.sh
tar -C /tmp/n -xJf .devbuild/b152.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:\|qwen3_next\|qwen3_5_moe" $L/gpu_tests.log | grep -av "graph vs eager decode" | head -30

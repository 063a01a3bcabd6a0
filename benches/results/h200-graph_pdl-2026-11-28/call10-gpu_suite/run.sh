#!/bin/bash
# Device call: the GPU suite on the final build (graphs rebuilt, wait-only PDL).
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
DELTASERVE_TESTS_DIR=$PWD/tests timeout 280 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
tail -1 $L/gpu_tests.log; grep -E "panicked" -A2 $L/gpu_tests.log | head

#!/usr/bin/env bash
# The one-row fused add + norm GEMV: prologue in fewer, larger blocks; balanced row runs (fat_probe.cu).
L=$OUT/logs; mkdir -p $L /tmp/n
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
cp .devbuild/fat_probe.cu $L/
nvcc -O3 -arch=sm_90a -std=c++17 -Ikernels/cuda .devbuild/fat_probe.cu -o /tmp/n/fat_probe > $L/build.log 2>&1; echo "build rc $?"
timeout 120 /tmp/n/fat_probe > $L/fat_probe.md 2>&1; echo "probe rc $?"
cat $L/fat_probe.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

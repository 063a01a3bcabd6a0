#!/usr/bin/env bash
# Why the projections at 16 rows stream W slower than the one-row GEMV: Nsight Compute's
# detailed sections for layer 0's four projections of a 1.39B decode step, as the skinny TMA
# kernel runs them (8 stages, the engine's default), as cuBLAS runs them, and the one-row
# GEMV's at batch 1. gpu_bench from run114's build, with DELTASERVE_SKINNY_STAGES=8 (HEAD's).
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t114.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
V=/tmp/deltaserve-gdn-1.3b
timeout 150 /tmp/n/gpu_bench --model-only --graphs-only --no-prefill --batches 1 --model-dir $V > $L/model.log 2>&1; echo "model rc $? at ${SECONDS}s"
N="ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control none --set detailed"
export DELTASERVE_SKINNY_STAGES=8
timeout 150 $N --kernel-name regex:skinny_bf16 --launch-count 4 /tmp/n/gpu_bench --profile-decode 16 --model-dir $V > $L/ncu-skinny-b16.txt 2>&1; echo "skinny rc $? at ${SECONDS}s"
DELTASERVE_SKINNY_GEMM=0 timeout 150 $N --kernel-name regex:nvjet --launch-count 4 /tmp/n/gpu_bench --profile-decode 16 --model-dir $V > $L/ncu-cublas-b16.txt 2>&1; echo "cublas rc $? at ${SECONDS}s"
timeout 150 $N --kernel-name regex:gemv --launch-count 4 /tmp/n/gpu_bench --profile-decode 1 --model-dir $V > $L/ncu-gemv-b1.txt 2>&1; echo "gemv rc $? at ${SECONDS}s"
for f in $L/ncu-*.txt; do echo "== $f"; grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|L1/TEX Hit|Achieved Occupancy|Registers Per Thread|Warp Cycles Per Issued|Block Limit|Mem Busy|Max Bandwidth" $f | head -80; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

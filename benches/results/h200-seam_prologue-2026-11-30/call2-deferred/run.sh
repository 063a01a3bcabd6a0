#!/bin/bash
# Deferred seam norm, call 2: the GPU suite on the new build, the probe again (errors against
# the f64 reference), then decode steps at batch 1 and 2: HEAD (base), the new build, and the new
# build with DELTASERVE_DEFERRED_NORM=0 (rounded), alternating, two rounds, both models.
mkdir -p /tmp/n /tmp/b && tar -C /tmp/n -xJf .devbuild/n1.tar.xz && tar -C /tmp/b -xJf .devbuild/b.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run14.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T=$(grep -o '("gpu_[a-z0-9_]*"' tests/gpu.rs | tr -d '("' | grep -v tensor_parallel)
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 220 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|test result|deferred seam" $L/gpu_tests.log | tail -14
s=$(date +%s)
ROUNDS=2 BATCHES=1,2 TIMEOUT=80 bash benches/ab_decode.sh $L/ab base=/tmp/b/gpu_bench new=/tmp/n/gpu_bench "rounded=DELTASERVE_DEFERRED_NORM=0 /tmp/n/gpu_bench" > $L/ab.out 2>&1
echo "ab rc=$? $(( $(date +%s) - s )) s"; cat $L/ab/summary.md
cp benches/defer_probe.cu $L/
nvcc -O3 -arch=sm_90a -std=c++17 -Ikernels/cuda benches/defer_probe.cu -o /tmp/defer_probe > $L/probe_build.log 2>&1 && timeout 100 /tmp/defer_probe > $L/defer_probe.md 2>&1
echo "probe rc=$?"; head -12 $L/defer_probe.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Deferred seam norm, call 4: the GPU suite on the new build, the probe again (errors against
# the f64 reference), then decode steps at batch 1 and 2: HEAD (base), the new build, and the new
# build with DELTASERVE_DEFERRED_NORM=1 (deferred); the new build keeps r and nw in registers for one and two rows, alternating, two rounds, both models.
mkdir -p /tmp/n /tmp/b && tar -C /tmp/n -xJf .devbuild/n1.tar.xz && tar -C /tmp/b -xJf .devbuild/b.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run15.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 220 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|test result|deferred seam" $L/gpu_tests.log | tail -14
s=$(date +%s)
ROUNDS=2 BATCHES=1,2 TIMEOUT=80 bash benches/ab_decode.sh $L/ab base=/tmp/b/gpu_bench new=/tmp/n/gpu_bench "deferred=DELTASERVE_DEFERRED_NORM=1 /tmp/n/gpu_bench" > $L/ab.out 2>&1
echo "ab rc=$? $(( $(date +%s) - s )) s"; cat $L/ab/summary.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

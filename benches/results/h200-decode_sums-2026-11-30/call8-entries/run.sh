#!/bin/bash
# Call 8: the final build (one-step vec entries apart from the n-step ones): the GPU suite, then
# decode steps against HEAD (base), alternating, two rounds, f32 states on both models.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz && tar -C /tmp/n -xJf .devbuild/base.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run13.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T=$(grep -o '("gpu_[a-z0-9_]*"' tests/gpu.rs | tr -d '("' | grep -v tensor_parallel)
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|test result" $L/gpu_tests.log | tail -8
s=$(date +%s)
ROUNDS=2 BATCHES=1,16,64 TIMEOUT=80 bash benches/ab_decode.sh $L/ab base=/tmp/n/gpu_bench_base new=/tmp/n/gpu_bench > $L/ab.out 2>&1
echo "ab rc=$? $(( $(date +%s) - s )) s"; cat $L/ab/summary.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

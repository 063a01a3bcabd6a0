#!/bin/bash
# Call 3: the decode step's column sums by one thread a column, k·q in warp 0, the gates' loads
# first: the GPU suite, then decode steps of this build (new) against HEAD's (base), alternating,
# two rounds, f32 states on both models and bf16 states on the 1.39B.
mkdir -p /tmp/n /tmp/b && tar -C /tmp/n -xJf .devbuild/t.tar.xz && tar -C /tmp/b -xJf .devbuild/base.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run10.sh $L/run.sh; cp benches/decode_probe.cu $L/
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T=$(grep -o '("gpu_[a-z0-9_]*"' tests/gpu.rs | tr -d '("' | grep -v tensor_parallel)
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|test result" $L/gpu_tests.log | tail -8
s=$(date +%s)
ROUNDS=2 BATCHES=1,16,64 TIMEOUT=80 bash benches/ab_decode.sh $L/ab base=/tmp/b/gpu_bench new=/tmp/n/gpu_bench > $L/ab.out 2>&1
echo "ab rc=$? $(( $(date +%s) - s )) s"; cat $L/ab/summary.md
s=$(date +%s)
MODELS=gdn ROUNDS=2 BATCHES=1,16,64 TIMEOUT=80 bash benches/ab_decode.sh $L/ab_bf16 "base=/tmp/b/gpu_bench --state-dtype bf16" "new=/tmp/n/gpu_bench --state-dtype bf16" > $L/ab_bf16.out 2>&1
echo "ab bf16 rc=$? $(( $(date +%s) - s )) s"; cat $L/ab_bf16/summary.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

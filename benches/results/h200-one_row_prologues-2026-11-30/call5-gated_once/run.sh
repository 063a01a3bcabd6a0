#!/bin/bash
# Call 5: gated_norm_gemv_v{Vd} (one row's gated output norm in one round trip) in the engine:
# the GPU suite (all but tensor parallelism), then the decode steps with it against
# DELTASERVE_GATED_NORM_ONCE=0, one binary alternating, three rounds.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run5.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T=$(grep -o '("gpu_[a-z0-9_]*"' tests/gpu.rs | tr -d '("' | grep -v tensor_parallel)
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 330 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|gated norm folded" $L/gpu_tests.log | tail -12
B=/tmp/n/gpu_bench
s=$(date +%s)
ROUNDS=3 BATCHES=1,16,64 MODELS=gdn TIMEOUT=80 bash benches/ab_decode.sh $L/ab once=$B "off=DELTASERVE_GATED_NORM_ONCE=0 $B" > $L/ab.out 2>&1
echo "ab rc=$? $(( $(date +%s) - s )) s"; cat $L/ab/summary.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

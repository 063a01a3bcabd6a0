#!/bin/bash
# Call 6: SwiGLU formed by the one-row fused [gate | up] projection (add_norm_gemv_swiglu) and
# the gated output norm in one round trip: the GPU suite (all but tensor parallelism), then the
# decode steps of this build against each change off and both off (HEAD's kernels), one binary
# alternating, two rounds, on the 1.39B and the Qwen3.5 layout.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run6.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T=$(grep -o '("gpu_[a-z0-9_]*"' tests/gpu.rs | tr -d '("' | grep -v tensor_parallel)
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|SwiGLU folded" $L/gpu_tests.log | tail -12
B=/tmp/n/gpu_bench
s=$(date +%s)
ROUNDS=2 BATCHES=1,16,64 TIMEOUT=80 bash benches/ab_decode.sh $L/ab new=$B "no_pairs=DELTASERVE_SWIGLU_PAIRS=0 $B" "head=DELTASERVE_SWIGLU_PAIRS=0 DELTASERVE_GATED_NORM_ONCE=0 $B" > $L/ab.out 2>&1
echo "ab rc=$? $(( $(date +%s) - s )) s"; cat $L/ab/summary.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

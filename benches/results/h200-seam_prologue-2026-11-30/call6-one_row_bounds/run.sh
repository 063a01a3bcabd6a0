#!/bin/bash
# Seam prologue, call 6: one row's prologue too loads h, delta and nw in one round, its kernels
# held at six blocks an SM (__launch_bounds__(256, 6): 40 registers, 4–12 bytes spilled). The
# fused seams' GPU tests and the decode step tests, then batch-1 steps against call 5's build
# (base), alternating, two rounds, both models.
mkdir -p /tmp/n /tmp/b && tar -C /tmp/n -xJf .devbuild/n2.tar.xz && tar -C /tmp/b -xJf .devbuild/b5.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run17.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 120 /tmp/n/gpu_tests gpu_norm_folded_into_gemv_equals_two_kernels gpu_swiglu_folded_into_gate_up_equals_two_kernels gpu_conv_folded_into_projection_equals_two_kernels gpu_decode_graphs_equal_eager_decode gpu_models_match_cpu_and_goldens > $L/gpu_tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked" $L/gpu_tests.log | tail -8
s=$(date +%s)
ROUNDS=2 BATCHES=1 TIMEOUT=60 bash benches/ab_decode.sh $L/ab base=/tmp/b/gpu_bench new=/tmp/n/gpu_bench > $L/ab.out 2>&1
echo "ab rc=$? $(( $(date +%s) - s )) s"; cat $L/ab/summary.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

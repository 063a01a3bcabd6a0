#!/usr/bin/env bash
# After the state passes' shared steps were factored out (chunk_wg.cuh): the GPU suite, and the
# probe from HEAD's kernels against the probe from the new ones (both wgmma passes timed).
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/k27.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda benches/wg_state_probe.cu -o /tmp/pnew > $L/build_new.log 2>&1 &
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -I.devbuild/head/cuda .devbuild/head/wg_state_probe.cu -o /tmp/phead > $L/build_head.log 2>&1 &
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1; echo "gpu tests rc $?"
grep -E "GPU tests:|FAILED|panicked" $L/gpu_tests.log | head; grep -E "two-warpgroup" $L/gpu_tests.log
wait
for p in phead pnew; do timeout 100 /tmp/$p > $L/probe_$p.md 2>&1; echo "$p rc $?"; grep -E '^## [0-9Q]|wgmma|FAIL|DIFF|ALL' $L/probe_$p.md | grep -v 'e-03 |'; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

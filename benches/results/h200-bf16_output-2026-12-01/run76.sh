#!/usr/bin/env bash
# The bf16 mixer writing O in bf16 (fla's output dtype), and the gated norm reading it: the GPU
# suite, and the state-pass probe, HEAD's and this one alternating.
L=$OUT/logs; mkdir -p $L /tmp/n /tmp/old
tar -C /tmp/n -xJf .devbuild/t29.tar.xz
tar -C /tmp/old -xJf .devbuild/old_src.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda benches/wg_state_probe.cu -o /tmp/pnew > $L/build_new.log 2>&1 &
(cd /tmp/old && nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda benches/wg_state_probe.cu -o /tmp/pold) > $L/build_old.log 2>&1 &
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? in ${SECONDS}s"
grep -E "test result|FAILED|panicked" $L/gpu_tests.log | head
wait
for r in 1 2; do
  timeout 60 /tmp/pold > $L/probe_old_$r.md 2>&1; echo "probe old rc $?"
  timeout 60 /tmp/pnew > $L/probe_new_$r.md 2>&1; echo "probe new rc $?"
done
grep -E '^## [0-9Q]|\| wgmma|FAIL|DIFF|ALL' $L/probe_old_1.md $L/probe_new_1.md | grep -v 'e-03 |'
echo "at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

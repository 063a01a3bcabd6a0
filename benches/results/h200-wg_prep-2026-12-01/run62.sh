#!/usr/bin/env bash
# The warpgroup prep for K ≤ 256: GPU suite, probe (K = 192 / 256 checks, the 1.39B's mixer
# shapes timed), the 1.39B's T=4096 prefill with the prep on and off alternating.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/k23.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
nvcc -O3 -lineinfo -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda benches/prep_probe.cu -o /tmp/pp > $L/build_probe.log 2>&1 &
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1; echo "gpu tests rc $?"
grep -E "GPU tests:|FAILED|panicked" $L/gpu_tests.log | head; grep -E "warpgroup prep" $L/gpu_tests.log
wait
timeout 120 /tmp/pp 30 > $L/probe.md 2>&1; echo "probe rc $?"; grep -E 'ms|MISMATCH|ALL|CTAs an SM|against' $L/probe.md
PREFILL=1 MODELS=gdn BATCHES=1 ROUNDS=3 TIMEOUT=150 timeout 420 bash benches/ab_decode.sh $L/ab on=/tmp/n/gpu_bench "off=DELTASERVE_TC_WG_PREP=0 /tmp/n/gpu_bench" > $L/ab.log 2>&1; echo "ab rc $?"
cat $L/ab/summary.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

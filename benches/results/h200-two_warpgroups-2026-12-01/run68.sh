#!/usr/bin/env bash
# The two-warpgroup state pass, its producer's waits reordered: checks, timings, phases and
# every CTA's span (-DWG_PROFILE) for both passes.
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda -DWG_PROFILE benches/wg_state_probe.cu -o /tmp/wgp > $L/build_p.log 2>&1 &
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda benches/wg_state_probe.cu -o /tmp/wgs > $L/build.log 2>&1 || cat $L/build.log
timeout 150 /tmp/wgs > $L/probe.md 2>&1; echo "probe rc $?"
grep -E '^## |wgmma|FAIL|DIFF|ALL' $L/probe.md | grep -v 'e-03 |'
wait
timeout 100 /tmp/wgp > $L/profile.md 2>&1; echo "profile rc $?"
grep -E '^## |phases|CTAs' $L/profile.md | grep -v check
cd $OUT && tar czf logs.tgz logs && rm -rf logs

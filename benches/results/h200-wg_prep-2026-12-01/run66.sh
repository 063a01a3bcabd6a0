#!/usr/bin/env bash
# Where a chunk's time goes in the wgmma state pass on the current build: the probe with
# -DWG_PROFILE (clocks a phase, CTA 0's thread 0, summed over its chunks).
L=$OUT/logs; mkdir -p $L
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda -DWG_PROFILE benches/wg_state_probe.cu -o /tmp/wgp > $L/build.log 2>&1 || cat $L/build.log
timeout 200 /tmp/wgp > $L/probe_profile.md 2>&1; echo "probe rc $?"
grep -E '^## |phases|ALL' $L/probe_profile.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

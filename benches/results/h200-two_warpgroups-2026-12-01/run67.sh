#!/usr/bin/env bash
# The state pass on two warpgroups (chunk_wg_ws.cuh) against the one-warpgroup pass: the probe's
# checks (f64 reference, bit for bit the old pass), timings, and the phases of each.
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda benches/wg_state_probe.cu -o /tmp/wgs > $L/build.log 2>&1 || cat $L/build.log
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda -DWG_PROFILE -DWS_PROF=4 benches/wg_state_probe.cu -o /tmp/wgp4 > $L/build_p4.log 2>&1 &
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda -DWG_PROFILE -DWS_PROF=1 benches/wg_state_probe.cu -o /tmp/wgp1 > $L/build_p1.log 2>&1 &
timeout 150 /tmp/wgs > $L/probe.md 2>&1; echo "probe rc $?"
grep -E '^## |wgmma|PASS|FAIL|bit|registers' $L/probe.md
wait
timeout 100 /tmp/wgp4 > $L/profile_ws.md 2>&1; echo "profile ws rc $?"
timeout 100 /tmp/wgp1 > $L/profile_wg.md 2>&1; echo "profile wg rc $?"
grep -E '^## |phases' $L/profile_ws.md $L/profile_wg.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# The wgmma state pass in 32-column tiles (twice the CTAs) against 64: bits and times, one probe.
L=$OUT/logs; mkdir -p $L
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda benches/wg_state_probe.cu -o /tmp/wgp > $L/build.log 2>&1 || cat $L/build.log
timeout 200 /tmp/wgp > $L/probe.md 2>&1; echo "probe rc $?"
grep -E '^## |32-column|wgmma \(new\) \| [0-9]|PASS|FAIL|DIFFER' $L/probe.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

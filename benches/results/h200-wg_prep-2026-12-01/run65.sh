#!/usr/bin/env bash
# O copied out a chunk later in the wgmma state pass (after the next Z and Y issue): the state-pass
# probe built from HEAD's kernels (.devbuild/old_cuda) and from the working tree, alternating.
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -I.devbuild/old_cuda benches/wg_state_probe.cu -o /tmp/wgp_old > $L/build_old.log 2>&1 &
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda benches/wg_state_probe.cu -o /tmp/wgp_new > $L/build_new.log 2>&1 &
wait
for r in 1 2; do
  timeout 120 /tmp/wgp_new > $L/probe_new_$r.md 2>&1; echo "new $r rc $?"
  timeout 120 /tmp/wgp_old > $L/probe_old_$r.md 2>&1; echo "old $r rc $?"
done
grep -E 'PASS|FAIL|registers' $L/probe_new_1.md | sort | uniq -c
for f in $L/probe_new_1.md $L/probe_old_1.md $L/probe_new_2.md $L/probe_old_2.md; do echo "== $f"; grep -E '^## |wgmma \(new\) \| [0-9]' $f | grep -B1 'wgmma' | grep -v '^--'; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

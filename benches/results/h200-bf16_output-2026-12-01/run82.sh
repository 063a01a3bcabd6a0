#!/usr/bin/env bash
# Tried: the warpgroup prep at six CTAs an SM (A and T at pitch 68, launch bounds 6: ≤ 85
# registers, spilling 128 bytes) against HEAD's five, prep_probe.cu alternating, two rounds.
L=$OUT/logs; mkdir -p $L /tmp/v
tar -C /tmp/v -xJf .devbuild/prepvar.tar.xz (tried.patch applied to a copy of kernels/)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda benches/prep_probe.cu -o /tmp/pbase > $L/build_base.log 2>&1 &
(cd /tmp/v && nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda benches/prep_probe.cu -o /tmp/pvar) > $L/build_var.log 2>&1 &
wait
for r in 1 2; do
  timeout 60 /tmp/pbase > $L/base_$r.md 2>&1; echo "base rc $?"
  timeout 60 /tmp/pvar > $L/var_$r.md 2>&1; echo "var rc $?"
done
for f in $L/base_1.md $L/var_1.md $L/base_2.md $L/var_2.md; do echo "== $f"; grep -E "CTAs an SM|^[0-9Q1].*x[0-9]|warpgroup  |MISMATCH|ALL" $f | grep -v "^check" | head -30; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

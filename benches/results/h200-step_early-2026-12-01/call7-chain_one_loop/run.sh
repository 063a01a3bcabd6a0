#!/usr/bin/env bash
# benches/chain_probe.cu as committed (its kernels sharing one read loop): batches 1, 16 and 64.
L=$OUT/logs; mkdir -p $L /tmp/n
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
nvcc -O3 -arch=sm_90a -std=c++17 benches/chain_probe.cu -o /tmp/n/chain_probe > $L/chain_build.log 2>&1; echo "build rc $?"
timeout 200 /tmp/n/chain_probe 1 16 64 > $L/chain.md 2>&1; echo "chain rc $?"
grep -E "^## |pdl \| 4 \| 8|early own \| 4|per layer \| 4" $L/chain.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

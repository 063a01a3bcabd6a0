#!/usr/bin/env bash
# Bounds at batch 16 and 64: chains of pure streams (benches/chain_probe.cu at batches 1, 16, 64,
# with and without the step's row kernels), HEAD's decode steps in the same call, and one
# replayed step of the 1.39B at batch 16 and 64 under Nsight Compute (kernels serialised).
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/b121.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
V=/tmp/deltaserve-gdn-1.3b
(nvcc -O3 -arch=sm_90a -std=c++17 benches/chain_probe.cu -o /tmp/n/chain_probe > $L/chain_build.log 2>&1) &
timeout 150 /tmp/n/gpu_bench --model-only --graphs-only --no-prefill --batches 1,16,64 --model-dir $V > $L/model.log 2>&1; echo "model rc $? at ${SECONDS}s"
wait
timeout 120 /tmp/n/chain_probe 1 16 64 > $L/chain.md 2>&1; echo "chain rc $? at ${SECONDS}s"
timeout 60 /tmp/n/gpu_bench --model-only --graphs-only --no-prefill --batches 1,16,64 --model-dir $V > $L/model2.log 2>&1; echo "model2 rc $? at ${SECONDS}s"
NCU="ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw"
for b in 16 64; do
  timeout 100 $NCU /tmp/n/gpu_bench --model-dir $V --reps 3 --profile-decode $b > $L/ncu-gdn-b$b.csv 2> $L/ncu-gdn-b$b.err
  python3 benches/ncu_kernels.py "1.39B decode step, batch $b" $L/ncu-gdn-b$b.csv > $L/kernels-gdn-b$b.md 2>&1
  echo "ncu b$b at ${SECONDS}s"
done
grep -E "^\| [0-9]" $L/model.log $L/model2.log; cat $L/chain.md
for f in $L/kernels-*.md; do head -40 $f; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 8: bf16 states, the 1.39B at batch 16 and 64: HEAD (base), column sums for every tile (a,
# call 7's build) and per-warp sums kept for bf16 tiles of four columns (w); three rounds.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/w.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run12.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
MODELS=gdn ROUNDS=3 BATCHES=16,64 TIMEOUT=150 bash benches/ab_decode.sh $L/ab_bf16 "base=/tmp/n/gpu_bench_base --state-dtype bf16" "a=/tmp/n/gpu_bench_a --state-dtype bf16" "w=/tmp/n/gpu_bench_w --state-dtype bf16" > $L/ab_bf16.out 2>&1
echo "ab bf16 rc=$? $(( $(date +%s) - s )) s"; cat $L/ab_bf16/summary.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

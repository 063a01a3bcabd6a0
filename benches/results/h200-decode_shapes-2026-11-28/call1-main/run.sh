#!/bin/bash
# Device call 1: H200 baseline of main (copy bandwidth measured in the run), per-kernel profiles.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L/prof
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/build_q35.log 2>&1) &
BUILD=$!
M=/tmp/gdn13
for r in 1 2; do
  echo "## round $r" >> $L/model.log
  timeout 150 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M >> $L/model.log 2>&1
done
wait $BUILD
H="--hybrid-dir /tmp/q35 --no-prefill --batches 1,16,64"
for r in 1 2; do
  echo "## round $r" >> $L/hybrid.log; timeout 100 /tmp/b/gpu_bench $H >> $L/hybrid.log 2>&1
done
NCU="ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw"
for b in 1 64; do
  timeout 120 $NCU /tmp/b/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches $b --reps 3 --profile-hybrid-decode $b > $L/prof/ncu-q35-b$b.csv 2> $L/prof/ncu-q35-b$b.err
  python3 benches/ncu_kernels.py "Qwen3.5-layout decode step, batch $b" $L/prof/ncu-q35-b$b.csv > $L/prof/kernels-q35-b$b.md 2>&1
done
for b in 1 16 64; do
  timeout 120 $NCU /tmp/b/gpu_bench --model-dir $M --reps 3 --profile-decode $b > $L/prof/ncu-gdn-b$b.csv 2> $L/prof/ncu-gdn-b$b.err
  python3 benches/ncu_kernels.py "1.39B decode step, batch $b" $L/prof/ncu-gdn-b$b.csv > $L/prof/kernels-gdn-b$b.md 2>&1
done
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
tail -3 $L/gpu_tests.log
cat $L/gpu.txt; grep -E "copy bandwidth|^\| [0-9]" $L/model.log; grep -o '"batch":[0-9]*.*"ms":[0-9.]*,"roofline_ms":[0-9.]*' $L/hybrid.log; grep -h "copy_bw" $L/hybrid.log | head -2
for f in $L/prof/kernels-*.md; do head -22 $f; done
tar -C $L -czf $OUT/base.tgz . 

#!/bin/bash
# Call 6: where the decode steps go now (this build): the Qwen3.5 layout at batch 1 and 64 and
# the 1.39B at batch 1, one replayed step each under Nsight Compute, kernels serialised.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/cur.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run6.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1) &
BUILD=$!
M=/tmp/gdn13
timeout 100 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M > $L/model.log 2>&1; echo "model rc=$?"
wait $BUILD
timeout 90 /tmp/b/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches 1,64 > $L/hybrid.log 2>&1; echo "hybrid rc=$?"
NCU="ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw"
for b in 1 64; do
  timeout 100 $NCU /tmp/b/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches $b --reps 3 --profile-hybrid-decode $b > $L/ncu-q35-b$b.csv 2> $L/ncu-q35-b$b.err
  python3 benches/ncu_kernels.py "Qwen3.5-layout decode step, batch $b" $L/ncu-q35-b$b.csv > $L/kernels-q35-b$b.md 2>&1
done
timeout 100 $NCU /tmp/b/gpu_bench --model-dir $M --reps 3 --profile-decode 1 > $L/ncu-gdn-b1.csv 2> $L/ncu-gdn-b1.err
python3 benches/ncu_kernels.py "1.39B decode step, batch 1" $L/ncu-gdn-b1.csv > $L/kernels-gdn-b1.md 2>&1
grep -E "^\| [0-9]" $L/model.log; grep -o '"what":"decode","batch":[0-9]*,"context":256,"ms":[0-9.]*' $L/hybrid.log
for f in $L/kernels-*.md; do head -30 $f; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

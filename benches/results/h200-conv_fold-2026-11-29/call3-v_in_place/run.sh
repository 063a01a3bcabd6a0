#!/bin/bash
# Call 3: the separate decode step (Gated DeltaNet with V > 128 past 16 rows) reads v in place
# from the conv output instead of a contiguous copy. GPU suite on this build, then the 1.39B's
# decode steps, HEAD (h, 7e2efdb) against this build (n) alternating, and the batch-64 step
# per kernel for both.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/sv.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run3.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests:" $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -20
grep -E "v in place=true" $L/gpu_tests.log | head -9
M=/tmp/gdn13
timeout 60 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M > /dev/null 2>&1
for b in h n h n h n; do
  bin=/tmp/n/gpu_bench; [ $b = h ] && bin=/tmp/n/gpu_bench_head
  timeout 25 $bin --model-only --no-prefill --graphs-only --model-dir $M --batches 1,16,32,64 > $L/model-$b.log 2>&1
  echo "gdn $b: $(grep -E '^\| [0-9]+ \| yes' $L/model-$b.log | awk -F'|' '{printf "%s:%s (%s) ", $2, $4, $7}')"
done
NCU="ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw"
for b in h n; do
  bin=/tmp/n/gpu_bench; [ $b = h ] && bin=/tmp/n/gpu_bench_head
  timeout 100 $NCU $bin --model-dir $M --reps 3 --profile-decode 64 > $L/ncu-gdn-b64-$b.csv 2> $L/ncu-gdn-b64-$b.err
  python3 benches/ncu_kernels.py "1.39B decode step, batch 64 ($b)" $L/ncu-gdn-b64-$b.csv > $L/kernels-gdn-b64-$b.md 2>&1
  head -32 $L/kernels-gdn-b64-$b.md | tail -20
done
rm -f $L/*.csv
cd $OUT && tar czf logs.tgz logs && rm -rf logs

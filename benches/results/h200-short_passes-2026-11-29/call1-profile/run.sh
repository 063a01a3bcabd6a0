#!/bin/bash
# Call 1 (2026-11-29 b): where short prefill passes spend their time on the H200 (HEAD 916e4e0).
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/head.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run1.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
M=/tmp/deltaserve-gdn-1.3b
s=$(date +%s); timeout 120 /tmp/b/gpu_bench --model-only --batches 1 --graphs-only > $L/model.md 2>&1; echo "model rc=$? $(( $(date +%s) - s )) s"
for v in def bv32; do
  e=""; [ $v = bv32 ] && e="DELTASERVE_TC_BV=32"
  s=$(date +%s); env $e timeout 150 /tmp/b/gpu_bench --small-prefill --model-dir $M > $L/small-$v.md 2>&1; echo "small $v rc=$? $(( $(date +%s) - s )) s"
done
for st in "8 64" "1 256" "1 64" "1 512"; do
  set -- $st
  timeout 120 ncu --profile-from-start off --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
    /tmp/b/gpu_bench --profile-prefill --profile-seqs $1 --profile-tokens $2 --model-dir $M > $L/ncu-s$1-t$2.csv 2> $L/ncu-s$1-t$2.err
  echo "ncu s$1 t$2 rc=$?"
  python3 benches/ncu_kernels.py "prefill pass $1 x $2 (bf16 mixer, continued)" $L/ncu-s$1-t$2.csv 0 > $L/kernels-s$1-t$2.md 2>&1
  head -30 $L/kernels-s$1-t$2.md | grep -E "chunk|nvjet|norm|conv|kernel time"
done
# The two mixer kernels of an 8 x 64 pass in detail (first launch of each).
timeout 150 ncu --profile-from-start off --clock-control none --cache-control none -k regex:"chunk_tc_prep|chunk_mma_state" -c 2 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section SourceCounters \
  --import-source no -o $L/mixer-s8-t64 /tmp/b/gpu_bench --profile-prefill --profile-seqs 8 --profile-tokens 64 --model-dir $M > $L/ncu-detail.log 2>&1
echo "ncu detail rc=$?"
ncu -i $L/mixer-s8-t64.ncu-rep --page details --csv > $L/mixer-s8-t64-details.csv 2>&1
ncu -i $L/mixer-s8-t64.ncu-rep --page source --csv --print-source sass > $L/mixer-s8-t64-source.csv 2>&1
ls -la $L
cd $OUT && tar czf logs.tgz logs && rm -rf logs

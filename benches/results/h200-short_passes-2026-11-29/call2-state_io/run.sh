#!/bin/bash
# Call 2: S loaded and stored 16 bytes at a time after the first chunk's copies are issued; the
# prep's key/query tiles by the compile-time loader and its K Kᵀ / Q Kᵀ tiles over the triangle.
# GPU suite; short passes head (916e4e0) against new alternating; per-kernel profiles; mixers.
mkdir -p /tmp/h /tmp/b && tar -C /tmp/h -xJf .devbuild/head.tar.xz && tar -C /tmp/b -xJf .devbuild/new.tar.xz && tar -C /tmp/b -xJf .devbuild/tests.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run2.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
M=/tmp/deltaserve-gdn-1.3b
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep "test result" $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -30
grep -E "bf16 q/k/v" $L/gpu_tests.log
s=$(date +%s); timeout 120 /tmp/b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-new0.md 2>&1; echo "model rc=$? $(( $(date +%s) - s )) s"
for r in 1 2; do for b in h b; do
  timeout 100 /tmp/$b/gpu_bench --small-prefill --model-dir $M > $L/small-$b-$r.md 2>&1; echo "small $b rc=$?"
done; done
for st in "8 64" "1 64"; do
  set -- $st
  timeout 120 ncu --profile-from-start off --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
    /tmp/b/gpu_bench --profile-prefill --profile-seqs $1 --profile-tokens $2 --model-dir $M > $L/ncu-s$1-t$2.csv 2> $L/ncu-s$1-t$2.err
  python3 benches/ncu_kernels.py "prefill pass $1 x $2 (bf16 mixer, continued)" $L/ncu-s$1-t$2.csv 0 > $L/kernels-s$1-t$2.md 2>&1
  head -30 $L/kernels-s$1-t$2.md | grep -E "chunk|kernel time"
done
timeout 150 ncu --profile-from-start off --clock-control none --cache-control none -k regex:"chunk_tc_prep|chunk_mma_state" -c 2 \
  --section WarpStateStats --section SourceCounters --section SpeedOfLight \
  --import-source no -o $L/mixer-s8-t64 /tmp/b/gpu_bench --profile-prefill --profile-seqs 8 --profile-tokens 64 --model-dir $M > $L/ncu-detail.log 2>&1
ncu -i $L/mixer-s8-t64.ncu-rep --page source --csv --print-source sass > $L/mixer-s8-t64-source.csv 2>&1
python3 benches/ncu_sass_segments.py $L/mixer-s8-t64-source.csv --kernel state --per 3072 > $L/segments-state.md 2>&1
python3 benches/ncu_sass_segments.py $L/mixer-s8-t64-source.csv --kernel prep --per 384 > $L/segments-prep.md 2>&1
rm -f $L/mixer-s8-t64-source.csv
for r in 1 2; do for b in h b; do
  timeout 60 /tmp/$b/gpu_bench --prefill-mixer-only > $L/mixers-$b-$r.md 2>&1; echo "mixers $b rc=$?"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/mixers-$b-$r.md | head -4
done; done
for b in h b h b; do
  timeout 60 /tmp/$b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-$b.md 2>&1
  echo "model $b rc=$?"; grep -i "^prefill" $L/model-$b.md
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 2: GPU suite with this build (PT2 in the prep launch, outputs beside V', cp.async-only
# loader); prefill mixer tables of main, build A (PT2 only) and this build alternating, with
# their default picks and with DELTASERVE_TC_DB=0; ncu stall reasons; the 1.39B's prefill.
mkdir -p /tmp/m /tmp/a /tmp/b && tar -C /tmp/m -xJf .devbuild/main.tar.xz && tar -C /tmp/a -xJf .devbuild/bins_a.tar.xz && tar -C /tmp/b -xJf .devbuild/bins.tar.xz && tar -C /tmp/b -xJf .devbuild/tests.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run2.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep "test result" $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -30
grep -iE "bf16.*fla|max abs|worst" $L/gpu_tests.log | head -20
DELTASERVE_TC_DB=0 DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/b/gpu_tests chunk packed fixture bf16 > $L/gpu_tests-db0.log 2>&1
echo "gpu_tests db0 rc=$?"; grep "test result" $L/gpu_tests-db0.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests-db0.log | head -20
for r in 1 2; do for b in m a b; do
  timeout 60 /tmp/$b/gpu_bench --prefill-mixer-only > $L/mixers-$b-$r.md 2>&1; echo "mixers $b rc=$?"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/mixers-$b-$r.md
done; done
for b in a b; do
  DELTASERVE_TC_DB=0 timeout 60 /tmp/$b/gpu_bench --prefill-mixer-only > $L/mixers-$b-db0.md 2>&1; echo "mixers $b db0 rc=$?"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/mixers-$b-db0.md
done
timeout 60 /tmp/b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-b0.md 2>&1   # writes the checkpoint
for b in m b m b; do
  timeout 60 /tmp/$b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-$b.md 2>&1
  echo "model $b rc=$?"; grep -i "^prefill" $L/model-$b.md
done
for v in "1 b" "0 b"; do
  set -- $v
  DELTASERVE_TC_DB=$1 timeout 100 ncu --clock-control none --section WarpStateStats --section SourceCounters -k regex:"chunk_" --launch-count 4 -o $L/ncu-db$1 /tmp/$2/gpu_bench --prefill-mixer-only --reps 1 > $L/ncu-db$1.log 2>&1
  echo "ncu db$1 rc=$?"
  ncu --import $L/ncu-db$1.ncu-rep --print-details all > $L/ncu-db$1.txt 2>&1
  grep -E "chunk_|Duration|Warp Cycles Per Issued" $L/ncu-db$1.txt | head -24
  ncu --import $L/ncu-db$1.ncu-rep --page source --csv --print-source sass > $L/ncu-db$1-sass.csv 2>/dev/null
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

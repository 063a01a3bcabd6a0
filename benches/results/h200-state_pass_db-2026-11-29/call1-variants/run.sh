#!/bin/bash
# Call 1: GPU suite with this build (default picks, and with DELTASERVE_TC_DB=0); prefill mixer
# table of main and this build's state-pass variants (value tile, double-buffered second group);
# the 1.39B's prefill; ncu stall reasons of the bf16 state pass at 1×4096.
mkdir -p /tmp/m /tmp/b && tar -C /tmp/m -xJf .devbuild/main.tar.xz && tar -C /tmp/b -xJf .devbuild/bins.tar.xz && tar -C /tmp/b -xJf .devbuild/tests.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run1.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep "test result" $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -20
s=$(date +%s)
DELTASERVE_TC_DB=0 DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/b/gpu_tests chunk packed > $L/gpu_tests-db0.log 2>&1
echo "gpu_tests db0 rc=$? $(( $(date +%s) - s )) s"; grep "test result" $L/gpu_tests-db0.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests-db0.log | head -20
s=$(date +%s)
timeout 60 /tmp/m/gpu_bench --skip-model > $L/mixers-m.md 2>&1; echo "mixers m rc=$? $(( $(date +%s) - s )) s"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/mixers-m.md
for v in "0 32" "1 32" "0 16" "1 16" "1 64" "x x" "0 32"; do
  set -- $v; n=db$1-bv$2
  if [ $1 = x ]; then n=default; E=""; else E="DELTASERVE_TC_DB=$1 DELTASERVE_TC_BV=$2"; fi
  env $E timeout 60 /tmp/b/gpu_bench --prefill-mixer-only > $L/mixers-$n.md 2>&1; echo "mixers $n rc=$?"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/mixers-$n.md
done
timeout 60 /tmp/m/gpu_bench --skip-model > $L/mixers-m2.md 2>&1; echo "mixers m2 rc=$?"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/mixers-m2.md
timeout 60 /tmp/b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-b0.md 2>&1   # writes the checkpoint
for b in m b m b; do
  timeout 60 /tmp/$b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-$b.md 2>&1
  echo "model $b rc=$?"; grep -i "^prefill" $L/model-$b.md
done
DELTASERVE_TC_DB=0 timeout 60 /tmp/b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-b-db0.md 2>&1
echo "model b db0 rc=$?"; grep -i "^prefill" $L/model-b-db0.md
s=$(date +%s)
for v in "0 32" "1 32"; do
  set -- $v
  DELTASERVE_TC_DB=$1 DELTASERVE_TC_BV=$2 timeout 100 ncu --clock-control none --section WarpStateStats --section SchedulerStats --section SourceCounters -k regex:"chunk_mma_state" --launch-count 1 -o $L/ncu-db$1 /tmp/b/gpu_bench --prefill-mixer-only --reps 1 > $L/ncu-db$1.log 2>&1
  echo "ncu db$1 rc=$? $(( $(date +%s) - s )) s"
  ncu --import $L/ncu-db$1.ncu-rep --print-details all > $L/ncu-db$1.txt 2>&1
  grep -iE "duration|stall|warp cycles per issued" $L/ncu-db$1.txt | head -30
  ncu --import $L/ncu-db$1.ncu-rep --page source --csv --print-source sass > $L/ncu-db$1-sass.csv 2>$L/ncu-db$1-sass.err; echo "sass rc=$? $(wc -l < $L/ncu-db$1-sass.csv) lines"; head -c 600 $L/ncu-db$1-sass.err
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

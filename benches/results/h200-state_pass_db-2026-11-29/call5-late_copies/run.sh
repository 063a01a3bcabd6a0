#!/bin/bash
# Call 5: P, T2 and G of the next chunk copied by warps 4-7 while warps 0-3 form V' (one-CTA-an-SM
# entries). GPU suite with this build; mixer tables of main, the committed build (c) and this
# build (n) alternating; the 1.39B's prefill c / n alternating; the Qwen3.5 layout c / n; ncu.
mkdir -p /tmp/m /tmp/c /tmp/n && tar -C /tmp/m -xJf .devbuild/main.tar.xz && tar -C /tmp/c -xJf .devbuild/bins_c.tar.xz && tar -C /tmp/n -xJf .devbuild/bins.tar.xz && tar -C /tmp/n -xJf .devbuild/tests.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run5.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; tail -1 $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -30
grep -E "bf16 q/k/v" $L/gpu_tests.log
timeout 60 /tmp/m/gpu_bench --skip-model > $L/mixers-m.md 2>&1; echo "mixers m rc=$?"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/mixers-m.md | head -4
for r in 1 2; do for b in c n; do
  timeout 60 /tmp/$b/gpu_bench --prefill-mixer-only > $L/mixers-$b-$r.md 2>&1; echo "mixers $b rc=$?"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/mixers-$b-$r.md
done; done
timeout 60 /tmp/n/gpu_bench --model-only --batches 1 --graphs-only > $L/model-n0.md 2>&1   # writes the checkpoint
for b in c n c n; do
  timeout 60 /tmp/$b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-$b.md 2>&1
  echo "model $b rc=$?"; grep -i "^prefill" $L/model-$b.md
done
timeout 100 ncu --clock-control none --section WarpStateStats --section SourceCounters -k regex:"chunk_mma" --launch-count 1 -o $L/ncu-n /tmp/n/gpu_bench --prefill-mixer-only --reps 1 > $L/ncu-n.log 2>&1
echo "ncu rc=$?"; ncu --import $L/ncu-n.ncu-rep --page source --csv --print-source sass > $L/ncu-n-sass.csv 2>/dev/null
python3 benches/ncu_sass_segments.py $L/ncu-n-sass.csv --kernel state --per 65536 | head -16; rm -f $L/ncu-n.ncu-rep
s=$(date +%s)
timeout 120 python3 -c "import sys; sys.path.insert(0, 'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/q35_build.log 2>&1
echo "q35 build rc=$? $(( $(date +%s) - s )) s"; tail -2 $L/q35_build.log
i=0
for b in c n c n; do
  i=$((i+1))
  timeout 90 /tmp/$b/gpu_bench --hybrid-dir /tmp/q35 --batches 1 > $L/hybrid-$b-$i.log 2>&1
  echo "hybrid $b rc=$?"; grep -E '"prefill"' $L/hybrid-$b-$i.log | cut -c1-120
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

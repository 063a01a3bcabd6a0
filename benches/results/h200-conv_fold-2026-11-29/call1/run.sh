#!/bin/bash
# Call 1: the short conv folded into the input projection's kernel (decode steps of 1-2 rows).
# GPU tests on this build (the new op test and the model tests), then decode steps with the conv
# apart (DELTASERVE_CONV_FOLD=0, o) and folded (n), alternating: the 1.39B, then the Qwen3.5
# layout; then kernel profiles at batch 1.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/fold.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run1.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1) &
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests:" $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -20
grep -E "folded into the input projection" $L/gpu_tests.log | head -4
M=/tmp/gdn13
timeout 60 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M > /dev/null 2>&1
run() { if [ $1 = o ]; then DELTASERVE_CONV_FOLD=0 "${@:2}"; else "${@:2}"; fi; }
for b in o n o n o n; do
  run $b timeout 25 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M > $L/model-$b.log 2>&1
  echo "gdn $b: $(grep -E '^\| [0-9]+ \| yes' $L/model-$b.log | awk -F'|' '{printf "%s:%s ", $2, $4}')"
done
wait
for b in o n o n o n; do
  run $b timeout 30 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches 1,2,64 > $L/q35-$b.log 2>&1
  echo "q35 $b: $(grep -o '"batch":[0-9]*,"context":256,"ms":[0-9.]*,"roofline_ms":[0-9.]*' $L/q35-$b.log | tr '\n' ' ')"
done
NCU="ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw"
for b in o n; do
  run $b timeout 100 $NCU /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches 1 --reps 3 --profile-hybrid-decode 1 > $L/ncu-q35-b1-$b.csv 2> $L/ncu-q35-b1-$b.err
  python3 benches/ncu_kernels.py "Qwen3.5-layout decode step, batch 1 ($b)" $L/ncu-q35-b1-$b.csv > $L/kernels-q35-b1-$b.md 2>&1
  head -30 $L/kernels-q35-b1-$b.md | tail -16
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 2: the skinny tensor-core GEMM for the narrow projections at 4-64 rows. The GPU suite
# (its new test among them), then decode steps with cuBLAS (DELTASERVE_SKINNY_GEMM=0, o) and the
# skinny kernel (n), alternating: the 1.39B, then the Qwen3.5 layout; then kernel profiles.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run2.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1) &
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 220 /tmp/n/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests:" $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -20
grep -E "skinny" $L/gpu_tests.log | head -8
M=/tmp/gdn13
timeout 60 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 1 > /dev/null 2>&1
run() { if [ $1 = o ]; then DELTASERVE_SKINNY_GEMM=0 "${@:2}"; else "${@:2}"; fi; }
for b in o n o n; do
  run $b timeout 40 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 4,8,16,32,64 > $L/model-$b.log 2>&1
  echo "gdn $b: $(grep -E '^\| [0-9]+ \| yes' $L/model-$b.log | awk -F'|' '{printf "%s:%s(%s) ", $2, $4, $7}')"
done
wait
for b in o n o n; do
  run $b timeout 40 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches 8,16,64 > $L/q35-$b.log 2>&1
  echo "q35 $b: $(grep -o '"batch":[0-9]*,"context":256,"ms":[0-9.]*,"roofline_ms":[0-9.]*' $L/q35-$b.log | tr '\n' ' ')"
done
NCU="ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw"
for b in o n; do
  run $b timeout 100 $NCU /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches 64 --reps 3 --profile-hybrid-decode 64 > $L/ncu-q35-b64-$b.csv 2> $L/ncu-q35-b64-$b.err
  python3 benches/ncu_kernels.py "Qwen3.5-layout decode step, batch 64 ($b)" $L/ncu-q35-b64-$b.csv > $L/kernels-q35-b64-$b.md 2>&1
  head -34 $L/kernels-q35-b64-$b.md | tail -22
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 1: the LM head's GEMV writing f32 logits (add_norm_gemv_f32y_*) against the cast launch
# (o: DELTASERVE_HEAD_F32=0), alternating; GPU tests of the kernel and of decode graphs.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run1.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1) &
BUILD=$!
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests norm_folded decode_graphs > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests:|folded into the projection" $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -20
M=/tmp/gdn13
timeout 90 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 1 > $L/model-warm.log 2>&1
run() { if [ $1 = o ]; then DELTASERVE_HEAD_F32=0 "${@:2}"; else "${@:2}"; fi; }
for b in o n o n o n; do
  run $b timeout 25 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 1,2 > $L/model-$b.log 2>&1
  echo "gdn $b: $(grep -E '^\| [0-9]+ \| yes' $L/model-$b.log | awk -F'|' '{printf "%s:%s %s ", $2, $4, $7}')"
done
wait $BUILD
for b in o n o n o n o n; do
  run $b timeout 30 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches 1,2 > $L/q35-$b.log 2>&1
  echo "q35 $b: $(grep -o '"batch":[0-9]*,"context":256,"ms":[0-9.]*,"roofline_ms":[0-9.]*' $L/q35-$b.log | tr '\n' ' ')"
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

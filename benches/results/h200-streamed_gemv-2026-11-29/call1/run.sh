#!/bin/bash
# Call 1: decode projections of 1-2 rows with W streamed through shared memory (bulk copies into
# a ring, one block an SM) against the register-loading kernels (DELTASERVE_GEMV_STREAM=0):
# the GEMV GPU tests, then decode steps alternating, the 1.39B and the Qwen3.5 layout, and a
# larger ring (DELTASERVE_GEMV_STREAM_BYTES=200000).
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run1.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1) &
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests streamed norm_folded gated_norm_folded conv_folded small_batch decode_graphs > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests:" $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -20
grep -E "streamed projections" $L/gpu_tests.log | head -4
M=/tmp/gdn13
timeout 60 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 1 > /dev/null 2>&1
run() { case $1 in o) DELTASERVE_GEMV_STREAM=0 "${@:2}";; w) DELTASERVE_GEMV_STREAM_BYTES=200000 "${@:2}";; *) "${@:2}";; esac; }
for b in o n w o n w; do
  run $b timeout 25 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 1,2,16 > $L/model-$b.log 2>&1
  echo "gdn $b: $(grep -E '^\| [0-9]+ \| yes' $L/model-$b.log | awk -F'|' '{printf "%s:%s %s ", $2, $4, $6}')"
done
wait
for b in o n w o n w; do
  run $b timeout 30 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches 1,2,64 > $L/q35-$b.log 2>&1
  echo "q35 $b: $(grep -o '"batch":[0-9]*,"context":256,"ms":[0-9.]*,"roofline_ms":[0-9.]*' $L/q35-$b.log | tr '\n' ' ')"
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

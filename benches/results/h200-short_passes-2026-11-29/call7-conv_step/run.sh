#!/bin/bash
# Call 7: the conv's decode step with 16-byte accesses at width 4: GPU suite, then the decode
# steps of `main` (2efe17f, c) and this build (n) alternating: the 1.39B and the Qwen3.5 layout.
mkdir -p /tmp/c /tmp/n && tar -C /tmp/c -xJf .devbuild/cur.tar.xz && tar -C /tmp/n -xJf .devbuild/conv.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run7.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1) &
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 125 /tmp/n/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests:" $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -20
M=/tmp/gdn13
timeout 40 /tmp/c/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M > /dev/null 2>&1
for b in c n c n; do
  timeout 25 /tmp/$b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M > $L/model-$b.log 2>&1
  echo "gdn $b: $(grep -E '^\| [0-9]+ \| yes' $L/model-$b.log | awk -F'|' '{printf "%s:%s ", $2, $4}')"
done
wait
for b in c n; do
  timeout 30 /tmp/$b/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches 1,64 > $L/q35-$b.log 2>&1
  echo "q35 $b: $(grep -o '"batch":[0-9]*,"context":256,"ms":[0-9.]*' $L/q35-$b.log | tr '\n' ' ')"
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

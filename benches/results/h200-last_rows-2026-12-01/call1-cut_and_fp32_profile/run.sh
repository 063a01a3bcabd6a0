#!/usr/bin/env bash
# The last block at the logits' rows: the GPU suite (with the new test), then T=4096 prefills of
# the 1.39B and the Qwen3.5 layout with the cut on and off (DELTASERVE_LAST_ROWS=0), alternating,
# three rounds; then where the 1.39B's near-fp32 prefill goes (ncu, kernels serialised).
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t98.tar.xz; tar -C /tmp/n -xJf .devbuild/b98.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -c "^test .* ok$" $L/gpu_tests.log; grep -a "FAILED\|panicked\|last row alone\|GPU tests:" $L/gpu_tests.log | head -40
MODELS="gdn q35" PREFILL=1 ROUNDS=3 BATCHES=1 TIMEOUT=80 timeout 330 bash benches/ab_decode.sh $L/ab "off=DELTASERVE_LAST_ROWS=0 /tmp/n/gpu_bench" "cut=/tmp/n/gpu_bench" > $L/ab.log 2>&1; echo "ab rc $? at ${SECONDS}s"
cat $L/ab/summary.md
grep -h '^prefill' $L/ab/*.log | head -30
MS=$(grep -h 'near-fp32 mixer' $L/ab/gdn-*-cut.log | head -1 | sed 's/.*: \([0-9.]*\) ms.*/\1/')
ncu --profile-from-start off --clock-control none --cache-control none \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
  timeout 100 /tmp/n/gpu_bench --profile-prefill --profile-fp32 --model-dir /tmp/deltaserve-gdn-1.3b > $L/ncu-fp32.csv 2> $L/ncu-fp32.err; echo "ncu rc $? at ${SECONDS}s"
python3 benches/ncu_kernels.py "prefill T=4096, near-fp32 mixer" $L/ncu-fp32.csv "$MS" > $L/kernels-fp32.md 2>&1
head -32 $L/kernels-fp32.md
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# The prefill conv with fewer rows a thread: T=4096 prefills (bf16 and near-fp32 mixer) and batch-1
# steps with 16 rows a thread (the default), 8 and 4 (DELTASERVE_CONV_TILE), alternating, two
# rounds, both models.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/b132.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
PREFILL=1 MODELS="gdn q35" ROUNDS=2 BATCHES=1 TIMEOUT=90 timeout 560 bash benches/ab_decode.sh $L/ab \
  "r16=/tmp/n/gpu_bench" "r8=DELTASERVE_CONV_TILE=8 /tmp/n/gpu_bench" "r4=DELTASERVE_CONV_TILE=4 /tmp/n/gpu_bench" > $L/ab.log 2>&1; echo "ab rc $? at ${SECONDS}s"
cat $L/ab/summary.md
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

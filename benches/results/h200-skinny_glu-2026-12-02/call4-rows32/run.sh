#!/usr/bin/env bash
# With SwiGLU and the conv in its epilogues, does the skinny GEMM now pay past 16 rows? Decode
# steps at 17, 24 and 32 rows with it to 16 rows (the default) and to 32 (DELTASERVE_SKINNY_ROWS=32),
# alternating, two rounds, both models.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/b130.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
MODELS="gdn q35" ROUNDS=2 BATCHES=17,24,32 TIMEOUT=70 timeout 560 bash benches/ab_decode.sh $L/ab \
  "r16=/tmp/n/gpu_bench" "r32=DELTASERVE_SKINNY_ROWS=32 /tmp/n/gpu_bench" > $L/ab.log 2>&1; echo "ab rc $? at ${SECONDS}s"
cat $L/ab/summary.md
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

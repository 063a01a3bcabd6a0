#!/usr/bin/env bash
# SwiGLU in the skinny GEMM's epilogue: the GPU suite, then decode steps at 4, 8 and 16 rows
# with it off / on (trigger at entry) / on (trigger after the products), alternating, two rounds.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t128.tar.xz; tar -C /tmp/n -xJf .devbuild/b128.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 230 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:" $L/gpu_tests.log | head -20; grep -a "skinny SwiGLU\|skinny GEMMs" $L/gpu_tests.log | head -12
MODELS="gdn q35" ROUNDS=2 BATCHES=4,8,16 TIMEOUT=70 timeout $((585 - SECONDS)) bash benches/ab_decode.sh $L/ab \
  "off=DELTASERVE_SKINNY_GLU=0 /tmp/n/gpu_bench" "t1=/tmp/n/gpu_bench" "t2=DELTASERVE_GLU_TRIGGER=2 /tmp/n/gpu_bench" > $L/ab.log 2>&1; echo "ab rc $? at ${SECONDS}s"
cat $L/ab/summary.md
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

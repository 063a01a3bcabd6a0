#!/usr/bin/env bash
# The short conv in the skinny GEMM's epilogue (with SwiGLU in it too): the GPU suite, then decode
# steps at 4, 8 and 16 rows with neither fold / SwiGLU only / both, alternating, two rounds.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t129.tar.xz; tar -C /tmp/n -xJf .devbuild/b129.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 230 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:" $L/gpu_tests.log | head -20; grep -a "skinny SwiGLU\|skinny GEMMs\|conv in the skinny" $L/gpu_tests.log | head -12
MODELS="gdn q35" ROUNDS=2 BATCHES=4,8,16 TIMEOUT=70 timeout $((585 - SECONDS)) bash benches/ab_decode.sh $L/ab \
  "none=DELTASERVE_SKINNY_GLU=0 DELTASERVE_CONV_FOLD=0 /tmp/n/gpu_bench" "glu=DELTASERVE_CONV_FOLD=0 /tmp/n/gpu_bench" "both=/tmp/n/gpu_bench" > $L/ab.log 2>&1; echo "ab rc $? at ${SECONDS}s"
cat $L/ab/summary.md
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# The final build with the two prefill kernels' softmax step shared (attention.cuh): the GPU
# suite, then the attention op against SDPA (warpgroup kernel and mma.sync).
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t39.tar.xz; tar -C /tmp/n -xJf .devbuild/b39.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -c "^test .* ok$" $L/gpu_tests.log; grep -a "FAILED\|panicked\|warpgroup kernel within\|test result" $L/gpu_tests.log | head
timeout 60 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --attention > $L/attn-wg.md 2>&1; echo "wg rc $? at ${SECONDS}s"
DELTASERVE_ATTN_WG=0 timeout 60 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --attention > $L/attn-mma.md 2>&1; echo "mma rc $? at ${SECONDS}s"
for f in wg mma; do echo "$f"; grep -h "^| [0-9]" $L/attn-$f.md | head -3; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

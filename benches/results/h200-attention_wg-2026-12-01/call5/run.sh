#!/usr/bin/env bash
# The final build: the GPU suite, the attention op against SDPA (warpgroup kernel and mma.sync,
# alternating), then transformers 5.17 + fla 0.6.0 against this build on the Qwen3.5 layout.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t38.tar.xz; tar -C /tmp/n -xJf .devbuild/b38.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -c "^test .* ok$" $L/gpu_tests.log; grep -a "FAILED\|panicked\|warpgroup kernel within\|test result" $L/gpu_tests.log | head
timeout 60 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --attention > $L/attn-wg.md 2>&1; echo "wg rc $? at ${SECONDS}s"
DELTASERVE_ATTN_WG=0 timeout 60 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --attention > $L/attn-mma.md 2>&1; echo "mma rc $? at ${SECONDS}s"
for f in wg mma; do echo "$f"; grep -h "^| [0-9]" $L/attn-$f.md | head -3; done
FLA=$(mktemp -d); pip install --quiet --no-deps --no-index --target "$FLA" .whl/*.whl 2>/dev/null
PYTHONPATH=$FLA timeout $((560 - SECONDS)) python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1; echo "hybrid rc $? at ${SECONDS}s"; tail -9 $L/hybrid_vs_hf.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

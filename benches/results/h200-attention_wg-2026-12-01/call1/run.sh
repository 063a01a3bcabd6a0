#!/usr/bin/env bash
# The warpgroup prefill attention (attention_wg.cu): its GPU test first, then the attention op
# against SDPA with it on and off (alternating), then the Qwen3.5 layout's T=4096 prefill with it
# on and off (ab_decode.sh, alternating), then the GPU suite.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t34.tar.xz; tar -C /tmp/n -xJf .devbuild/b34.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
DELTASERVE_TESTS_DIR=$PWD/tests timeout 120 /tmp/n/gpu_tests gpu_paged_attention_matches_cpu --nocapture > $L/attn_test.log 2>&1; echo "attn test rc $? in ${SECONDS}s"
grep -a "paged attention\|panicked\|FAILED\|test result" $L/attn_test.log | tail -25
for r in 1 2; do
  timeout 100 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --attention > $L/attn-wg-$r.md 2>&1; echo "wg $r rc $? at ${SECONDS}s"
  DELTASERVE_ATTN_WG=0 timeout 100 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --attention > $L/attn-mma-$r.md 2>&1; echo "mma $r rc $? at ${SECONDS}s"
done
grep -h "^|" $L/attn-wg-1.md $L/attn-mma-1.md $L/attn-wg-2.md $L/attn-mma-2.md | grep -v "\-\-\-"
MODELS=q35 PREFILL=1 ROUNDS=2 BATCHES=1 TIMEOUT=120 timeout $((470 - SECONDS)) bash benches/ab_decode.sh $L/ab wg=/tmp/n/gpu_bench "mma=DELTASERVE_ATTN_WG=0 /tmp/n/gpu_bench"; echo "ab rc $? at ${SECONDS}s"
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout $((590 - SECONDS)) /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? in ${SECONDS}s"
grep -c "^test .* ok$" $L/gpu_tests.log; grep -a "FAILED\|panicked" $L/gpu_tests.log | head
cd $OUT && tar czf logs.tgz logs && rm -rf logs

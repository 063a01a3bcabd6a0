#!/usr/bin/env bash
# The warpgroup prefill attention's ping-pong without divergent turns: its GPU test (pp and not),
# the op against SDPA (pp, no pp, mma.sync; alternating), the Qwen3.5 layout's prefill (the three).
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t37.tar.xz; tar -C /tmp/n -xJf .devbuild/b37.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
for v in 1 0; do
  DELTASERVE_ATTN_PINGPONG=$v DELTASERVE_TESTS_DIR=$PWD/tests timeout 60 /tmp/n/gpu_tests gpu_paged_attention_matches_cpu --nocapture > $L/attn_test_pp$v.log 2>&1; echo "attn test pp=$v rc $? at ${SECONDS}s"
  grep -a "paged attention:\|panicked\|test result" $L/attn_test_pp$v.log | tail -3
done
for r in 1 2; do
  timeout 60 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --attention > $L/attn-pp-$r.md 2>&1; echo "pp $r rc $? at ${SECONDS}s"
  DELTASERVE_ATTN_PINGPONG=0 timeout 60 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --attention > $L/attn-nopp-$r.md 2>&1; echo "nopp $r rc $? at ${SECONDS}s"
  DELTASERVE_ATTN_WG=0 timeout 60 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --attention > $L/attn-mma-$r.md 2>&1; echo "mma $r rc $? at ${SECONDS}s"
done
for f in pp-1 nopp-1 mma-1 pp-2 nopp-2 mma-2; do echo "$f"; grep -h "^| [0-9]" $L/attn-$f.md | head -3; done
MODELS=q35 PREFILL=1 ROUNDS=2 BATCHES=1 TIMEOUT=120 timeout $((500 - SECONDS)) bash benches/ab_decode.sh $L/ab pp=/tmp/n/gpu_bench "nopp=DELTASERVE_ATTN_PINGPONG=0 /tmp/n/gpu_bench" "mma=DELTASERVE_ATTN_WG=0 /tmp/n/gpu_bench"; echo "ab rc $? at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

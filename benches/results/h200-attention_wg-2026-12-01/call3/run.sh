#!/usr/bin/env bash
# The warpgroup prefill attention: producer's cursor and batched offsets, full barriers as
# mbarriers, P·V and the next S issued together, with and without ping-pong. Its GPU test (both
# variants), the op against SDPA (pp, no pp, mma.sync; alternating), Nsight Compute on pp, the
# Qwen3.5 layout's prefill (pp against mma.sync), then the GPU suite.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t36.tar.xz; tar -C /tmp/n -xJf .devbuild/b36.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
for v in 1 0; do
  DELTASERVE_ATTN_PINGPONG=$v DELTASERVE_TESTS_DIR=$PWD/tests timeout 60 /tmp/n/gpu_tests gpu_paged_attention_matches_cpu --nocapture > $L/attn_test_pp$v.log 2>&1; echo "attn test pp=$v rc $? at ${SECONDS}s"
  grep -a "paged attention:\|panicked\|test result" $L/attn_test_pp$v.log | tail -5
done
for r in 1 2; do
  timeout 60 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --attention > $L/attn-pp-$r.md 2>&1; echo "pp $r rc $? at ${SECONDS}s"
  DELTASERVE_ATTN_PINGPONG=0 timeout 60 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --attention > $L/attn-nopp-$r.md 2>&1; echo "nopp $r rc $? at ${SECONDS}s"
  DELTASERVE_ATTN_WG=0 timeout 60 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --attention > $L/attn-mma-$r.md 2>&1; echo "mma $r rc $? at ${SECONDS}s"
done
for f in pp-1 nopp-1 mma-1 pp-2 nopp-2 mma-2; do echo "$f"; grep -h "^| [0-9]" $L/attn-$f.md | head -3; done
timeout 100 ncu --set full -k regex:attn_wg --launch-count 1 -f -o $L/ncu-pp /tmp/n/gpu_bench --attention-only --reps 1 > $L/ncu-pp.log 2>&1; echo "ncu rc $? at ${SECONDS}s"
ncu -i $L/ncu-pp.ncu-rep --page details > $L/ncu-pp-details.txt 2>&1
ncu -i $L/ncu-pp.ncu-rep --page source --csv --print-source sass > $L/ncu-pp-sass.csv 2>&1
grep -E "Duration|Issue Slots Busy|No Eligible" $L/ncu-pp-details.txt | head -4
MODELS=q35 PREFILL=1 ROUNDS=2 BATCHES=1 TIMEOUT=120 timeout $((450 - SECONDS)) bash benches/ab_decode.sh $L/ab wg=/tmp/n/gpu_bench "mma=DELTASERVE_ATTN_WG=0 /tmp/n/gpu_bench"; echo "ab rc $? at ${SECONDS}s"
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout $((590 - SECONDS)) /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -c "^test .* ok$" $L/gpu_tests.log; grep -a "FAILED\|panicked" $L/gpu_tests.log | head
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# Prefill attention with FlashAttention-3's overlap inside a warpgroup (b158): the GPU suite; the
# attention op, HEAD's build (base) against this one, alternating, two rounds; the op against
# torch SDPA; the Qwen3.5-layout model against transformers 5.17 + fla 0.6.0 in one run; its
# T=4096 prefill base against new, alternating, two rounds.
L=$OUT/logs; mkdir -p $L /tmp/n; cp .devbuild/run158.sh $L/run.sh
tar -C /tmp/n -xJf .devbuild/b158.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
DELTASERVE_TESTS_DIR=$PWD/tests timeout 90 /tmp/n/gpu_tests gpu_paged_attention_matches_cpu --nocapture > $L/attn_test.log 2>&1; echo "attn test rc $? at ${SECONDS}s"
grep -a "warpgroup\|bit\|FAILED\|panicked\|test result" $L/attn_test.log | head -12
for round in 1 2; do
  for v in base new; do
    B=/tmp/n/gpu_bench; [ $v = base ] && B=/tmp/n/gpu_bench_base
    timeout 60 $B --attention-only --reps 20 > $L/attn-$v-$round.log 2>&1
    echo "$v $round: $(grep '^OURS' $L/attn-$v-$round.log | python3 -c 'import sys, json; print(" ".join("%dx%d/%d %.4f" % (r["batch"], r["context"], r["rows"], r["ms"]) for r in (json.loads(l[5:]) for l in sys.stdin)))')"
  done
done
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl > $L/pip.log 2>&1
timeout 120 python3 benches/hybrid_vs_hf.py --attention --bench-bin /tmp/n/gpu_bench > $L/attn_vs_sdpa.log 2>&1; echo "sdpa rc $? at ${SECONDS}s"
grep '^|' $L/attn_vs_sdpa.log | head -6
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 260 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:\|test result" $L/gpu_tests.log | head -10
PYTHONPATH=$FLA timeout 200 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --reps 20 > $L/q35_vs_hf.log 2>&1
echo "q35_vs_hf rc $? at ${SECONDS}s"; grep "^|\|^##" $L/q35_vs_hf.log | tail -8
M=/tmp/deltaserve-qwen3_5-2b
for round in 1 2; do
  for v in base new; do
    B=/tmp/n/gpu_bench; [ $v = base ] && B=/tmp/n/gpu_bench_base
    [ $SECONDS -gt 540 ] && break 2
    timeout 60 $B --hybrid-dir $M --batches 1 --reps 10 > $L/ab-$v-$round.log 2>&1
    echo "$v $round: $(grep '^OURS' $L/ab-$v-$round.log | grep prefill | python3 -c 'import sys, json; print(" ".join("%s %.2f ms" % (json.loads(l[5:])["algo"], json.loads(l[5:])["ms"]) for l in sys.stdin))')"
  done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Prefill row kernels, call 7: prep on a flat grid of 256-thread blocks (a warp a head of four
# rows), the attention gate four columns a thread. Tests first (prep's, the attention op's with
# its fused-decode gate bit for bit, the models' goldens), then the Qwen3.5 prefill against call
# 3's build (base), alternating, two rounds. Logs straight into $OUT (partial results return).
mkdir -p /tmp/n /tmp/b && tar -C /tmp/n -xJf .devbuild/n3.tar.xz && tar -C /tmp/b -xJf .devbuild/b3.tar.xz
cp .devbuild/run24.sh $OUT/run.sh
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 90 /tmp/n/gpu_tests gpu_prefill_row_kernels_equal_decode_variants gpu_raw_decode_step_equals_prepare_then_step gpu_prep_and_gated_norm_match_cpu gpu_paged_attention_matches_cpu gpu_models_match_cpu_and_goldens > $OUT/gpu_tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked" $OUT/gpu_tests.log | tail -4
s=$(date +%s)
python3 -c "import sys; sys.path.insert(0, 'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $OUT/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - s )) s"
for r in 1 2; do
  for v in base new; do
    timeout 40 /tmp/${v:0:1}/gpu_bench --hybrid-dir /tmp/q35 --batches 1 --reps 3 > $OUT/q35-$r-$v.log 2>&1
    echo "$r $v: $(grep '"what":"prefill"' $OUT/q35-$r-$v.log | sed 's/.*"algo":"\([A-Za-z0-9]*\)".*"ms":\([0-9.]*\).*/\1 \2/' | tr '\n' ' ') $(( $(date +%s) - s )) s"
  done
done

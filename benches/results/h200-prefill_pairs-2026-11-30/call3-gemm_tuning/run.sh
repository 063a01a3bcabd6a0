#!/bin/bash
# Session 16, call 3: prefill GEMMs' algorithms timed among those with the heuristic's bits.
# Changed tests, then the Qwen3.5 and 1.39B prefills: everything on, the GEMM timing off, and
# all three changes off (one binary, alternating, two rounds).
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/p3.tar.xz
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests gpu_tuned_gemm_gives_the_heuristics_bits gpu_gemm_matches_cpu gpu_paired_prep_equals_one_head_a_cta gpu_split_projections_leave_a_models_logits > $OUT/gpu_tests_changed.log 2>&1
echo "changed tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|differ from|timed" $OUT/gpu_tests_changed.log | tail -20
s=$(date +%s)
python3 -c "import sys; sys.path.insert(0, 'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > /dev/null 2>&1
echo "build rc=$? $(( $(date +%s) - s )) s"
for r in 1 2; do
  for v in on tune_off all_off; do
    e="DELTASERVE_GEMM_TUNE=1"
    case $v in tune_off) e="DELTASERVE_GEMM_TUNE=0";; all_off) e="DELTASERVE_GEMM_TUNE=0 DELTASERVE_PREP_PAIRS=0 DELTASERVE_ATTN_HEAD_PAIRS=0";; esac
    echo "== $r $v q35" >> $OUT/ab.log
    env $e timeout 40 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --batches 1 --reps 3 > /tmp/q.log 2>&1; cat /tmp/q.log >> $OUT/ab.log
    echo "$r $v q35: $(grep '"what":"prefill"' /tmp/q.log | sed 's/.*"algo":"\([A-Za-z0-9]*\)".*"ms":\([0-9.]*\).*/\1 \2/' | tr '\n' ' ') $(( $(date +%s) - s )) s"
    echo "== $r $v 1.39B" >> $OUT/ab.log
    env $e timeout 60 /tmp/n/gpu_bench --model-only --reps 3 > /tmp/m.log 2>&1; cat /tmp/m.log >> $OUT/ab.log
    echo "$r $v 1.39B: $(grep 'prefill B=1, T=4096' /tmp/m.log | sed 's/prefill B=1, T=4096 //; s/ = .*//' | tr '\n' ' ') $(( $(date +%s) - s )) s"
  done
done

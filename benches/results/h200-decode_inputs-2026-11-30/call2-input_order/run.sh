#!/bin/bash
# Call 2: the decode step's first-step inputs loaded right after its state (B, this build)
# against HEAD (b) and against loading them before the state (a: call 1's build with
# DELTASERVE_DECODE_PIPE=0), alternating, three rounds; then the GPU suite on this build.
mkdir -p /tmp/n /tmp/b /tmp/a && tar -C /tmp/n -xJf .devbuild/t.tar.xz && tar -C /tmp/b -xJf .devbuild/base.tar.xz && tar -C /tmp/a -xJf .devbuild/a.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run2.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
run() { local t=$1 v=$2; shift 2; case $v in b) timeout $t /tmp/b/gpu_bench "$@";; a) DELTASERVE_DECODE_PIPE=0 timeout $t /tmp/a/gpu_bench "$@";; n) timeout $t /tmp/n/gpu_bench "$@";; esac; }
i=0
for r in 1 2 3; do for v in b a n; do
  i=$((i+1))
  run 60 $v --hybrid-dir /tmp/q35 --no-prefill --batches 1,16,64 > $L/q35-$i-$v.log 2>&1
  echo "q35 $v: $(grep -h '"decode"' $L/q35-$i-$v.log | python3 -c "
import sys,json
for l in sys.stdin:
  d=json.loads(l[5:]); print(d['batch'], '%.4f' % d['ms'], '%.2f%%' % (100*d['roofline_ms']/d['ms']), end='  ')")"
done; done
M=/tmp/gdn13
for r in 1 2 3; do for v in b a n; do
  i=$((i+1))
  run 90 $v --model-only --no-prefill --graphs-only --model-dir $M --batches 1,16,64 > $L/model-$i-$v.log 2>&1
  echo "gdn $v: $(grep -E '^\| [0-9]+ \| yes' $L/model-$i-$v.log | awk -F'|' '{printf "%s: %.4f ms %s ", $2, 1000*$2/$5, $7}')"
done; done
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests gpu_gemm_matches_cpu gpu_norm_folded_into_gemv_equals_two_kernels gpu_gated_norm_folded_into_gemv_equals_two_kernels gpu_conv_folded_into_projection_equals_two_kernels gpu_sampling_matches_cpu gpu_sampling_follows_the_distribution gpu_prefix_cache_snapshots_match_whole_prefills gpu_batch_invariant_mode_logits_do_not_depend_on_the_batch gpu_sparse_moe_matches_cpu gpu_paged_attention_matches_cpu gpu_ops_match_reference gpu_conv_and_swiglu_match_cpu gpu_prep_and_gated_norm_match_cpu gpu_small_batch_linear_matches_cpu gpu_models_match_cpu_and_goldens gpu_packed_prefill_equals_prefilling_each_alone gpu_decode_in_any_slot_order_equals_each_alone gpu_raw_decode_step_equals_prepare_then_step gpu_packed_model_prefill_equals_each_alone gpu_mixed_passes_equal_separate_passes gpu_pruning_calibration_matches_the_cpu gpu_chunk_boundaries_match_cpu gpu_decode_graphs_equal_eager_decode gpu_prefill_graphs_equal_eager_prefill gpu_mixed_graphs_equal_eager_mixed_passes gpu_warm_up_leaves_the_pool_as_it_was gpu_host_tier_round_trips_snapshots_exactly gpu_batch_invariant_mode_decode_step_rows_do_not_depend_on_the_batch > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "GPU tests|FAIL|panicked" $L/tests.log | tail -5
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 3: the decode step's q, k and v loaded before its state, β and the decay formed after its
# loads are issued, its products pinned as explicit fma (this build, n) against HEAD (b). The
# GPU suite (all but the tensor-parallel test), then decode steps alternating, three rounds,
# then the served 1.39B (vocabulary 4,096) at 1, 16 and 64 streams against the bare step.
mkdir -p /tmp/n /tmp/b && tar -C /tmp/n -xJf .devbuild/t.tar.xz && tar -C /tmp/b -xJf .devbuild/base.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run3.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests gpu_gemm_matches_cpu gpu_norm_folded_into_gemv_equals_two_kernels gpu_gated_norm_folded_into_gemv_equals_two_kernels gpu_conv_folded_into_projection_equals_two_kernels gpu_sampling_matches_cpu gpu_sampling_follows_the_distribution gpu_prefix_cache_snapshots_match_whole_prefills gpu_batch_invariant_mode_logits_do_not_depend_on_the_batch gpu_sparse_moe_matches_cpu gpu_paged_attention_matches_cpu gpu_ops_match_reference gpu_conv_and_swiglu_match_cpu gpu_prep_and_gated_norm_match_cpu gpu_small_batch_linear_matches_cpu gpu_models_match_cpu_and_goldens gpu_packed_prefill_equals_prefilling_each_alone gpu_decode_in_any_slot_order_equals_each_alone gpu_raw_decode_step_equals_prepare_then_step gpu_batch_invariant_mode_decode_step_rows_do_not_depend_on_the_batch gpu_packed_model_prefill_equals_each_alone gpu_mixed_passes_equal_separate_passes gpu_pruning_calibration_matches_the_cpu gpu_chunk_boundaries_match_cpu gpu_decode_graphs_equal_eager_decode gpu_prefill_graphs_equal_eager_prefill gpu_mixed_graphs_equal_eager_mixed_passes gpu_warm_up_leaves_the_pool_as_it_was gpu_host_tier_round_trips_snapshots_exactly gpu_ops_match_reference gpu_models_match_cpu_and_goldens gpu_packed_model_prefill_equals_each_alone gpu_decode_graphs_equal_eager_decode  > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "GPU tests|FAIL|panicked" $L/tests.log | tail -5
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
run() { local t=$1 v=$2; shift 2; timeout $t /tmp/$v/gpu_bench "$@"; }
i=0
for r in 1 2 3; do for v in b n; do
  i=$((i+1))
  run 60 $v --hybrid-dir /tmp/q35 --no-prefill --batches 1,16,64 > $L/q35-$i-$v.log 2>&1
  echo "q35 $v: $(grep -h '"decode"' $L/q35-$i-$v.log | python3 -c "
import sys,json
for l in sys.stdin:
  d=json.loads(l[5:]); print(d['batch'], '%.4f' % d['ms'], '%.2f%%' % (100*d['roofline_ms']/d['ms']), end='  ')")"
done; done
M=/tmp/gdn13
for r in 1 2 3; do for v in b n; do
  i=$((i+1))
  run 90 $v --model-only --no-prefill --graphs-only --model-dir $M --batches 1,16,64 > $L/model-$i-$v.log 2>&1
  echo "gdn $v: $(grep -E '^\| [0-9]+ \| yes' $L/model-$i-$v.log | awk -F'|' '{printf "%s: %.4f ms %s ", $2, 1000*$2/$5, $7}')"
done; done
V=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $V/config.json ] || /tmp/n/deltaserve init-random --config $L/config.json -o $V --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
timeout 120 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $V --batches 1,16,64 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s: %.4f ms %s tok/s ", $2, 1000*$2/$5, $5}')"
MODEL=$V timeout 220 bash benches/serving_sweep.sh /tmp/n/deltaserve /tmp/n/serve_bench $L/sweep 1 16 64 > $L/sweep.log 2>&1
echo "sweep rc=$?"; cat $L/sweep/table.md
rm -f $L/sweep/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

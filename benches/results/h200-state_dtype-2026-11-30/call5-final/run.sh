#!/bin/bash
# Call 5: the final build. The GPU suite but tensor parallel; decode steps with f32 and bf16
# states, one binary, alternating, two rounds; the served 1.39B (vocabulary 4,096) at 64 streams
# with each, two rounds in turn, beside the bare steps.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run5.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T="gpu_gemm_matches_cpu gpu_gemm_f32_output_is_the_unrounded_product gpu_split_projection_slices_sum_to_the_product gpu_split_projections_leave_a_models_logits gpu_norm_folded_into_gemv_equals_two_kernels gpu_gated_norm_folded_into_gemv_equals_two_kernels gpu_conv_folded_into_projection_equals_two_kernels gpu_sampling_matches_cpu gpu_sampling_follows_the_distribution gpu_prefix_cache_snapshots_match_whole_prefills gpu_batch_invariant_mode_logits_do_not_depend_on_the_batch gpu_sparse_moe_matches_cpu gpu_paged_attention_matches_cpu gpu_ops_match_reference gpu_conv_and_swiglu_match_cpu gpu_prep_and_gated_norm_match_cpu gpu_small_batch_linear_matches_cpu gpu_models_match_cpu_and_goldens gpu_bf16_states_follow_the_goldens gpu_packed_prefill_equals_prefilling_each_alone gpu_decode_in_any_slot_order_equals_each_alone gpu_raw_decode_step_equals_prepare_then_step gpu_batch_invariant_mode_decode_step_rows_do_not_depend_on_the_batch gpu_packed_model_prefill_equals_each_alone gpu_mixed_passes_equal_separate_passes gpu_pruning_calibration_matches_the_cpu gpu_chunk_boundaries_match_cpu gpu_decode_graphs_equal_eager_decode gpu_prefill_graphs_equal_eager_prefill gpu_mixed_graphs_equal_eager_mixed_passes gpu_warm_up_leaves_the_pool_as_it_was gpu_host_tier_round_trips_snapshots_exactly gpu_ops_match_reference gpu_models_match_cpu_and_goldens gpu_packed_model_prefill_equals_each_alone gpu_decode_graphs_equal_eager_decode "
DELTASERVE_TESTS_DIR=$PWD/tests timeout 330 /tmp/n/gpu_tests $T > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "GPU tests|FAILED|panicked" $L/tests.log | tail -6; grep -E "bf16 states [0-9]" $L/tests.log | awk '{print $1, $2, $3, $(NF-5), $(NF-4), $(NF-3), $(NF-2), $(NF-1), $NF}' | sort -k6 -g | tail -8
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
B=/tmp/n/gpu_bench
ROUNDS=2 BATCHES=1,16,64 TIMEOUT=90 bash benches/ab_decode.sh $L/ab f32=$B "bf16=$B --state-dtype bf16" > $L/ab.out 2>&1
cat $L/ab/summary.md
V=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $V/config.json ] || /tmp/n/deltaserve init-random --config $L/config.json -o $V --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
for sd in f32 bf16; do
  timeout 60 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $V --batches 64 --state-dtype $sd > $L/bare-$sd.log 2>&1
  echo "bare $sd: $(grep -E '^\| [0-9]+ \| yes' $L/bare-$sd.log | awk -F'|' '{printf "%s: %s ms %s tok/s %s", $2, $4, $5, $7}')"
  printf '#!/bin/sh\nexec /tmp/n/deltaserve "$@" --state-dtype %s\n' $sd > /tmp/n/serve-$sd; chmod +x /tmp/n/serve-$sd
done
for r in 1 2; do for sd in f32 bf16; do
  MODEL=$V timeout 100 bash benches/serving_sweep.sh /tmp/n/serve-$sd /tmp/n/serve_bench $L/sweep-$sd-$r 64 > $L/sweep-$sd-$r.log 2>&1
  echo "served $sd $r rc=$?"; tail -1 $L/sweep-$sd-$r/table.md; rm -f $L/sweep-$sd-$r/serve-*.log
done; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 6: the GPU suite on the committed build (dc61dfc), every test but the tensor-parallel one
# (it needs two GPUs).
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run6.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
start=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 500 /tmp/n/gpu_tests gpu_gemm_matches_cpu gpu_norm_folded_into_gemv_equals_two_kernels gpu_gated_norm_folded_into_gemv_equals_two_kernels gpu_conv_folded_into_projection_equals_two_kernels gpu_sampling_matches_cpu gpu_sampling_follows_the_distribution gpu_prefix_cache_snapshots_match_whole_prefills gpu_batch_invariant_mode_logits_do_not_depend_on_the_batch gpu_sparse_moe_matches_cpu gpu_paged_attention_matches_cpu gpu_ops_match_reference gpu_conv_and_swiglu_match_cpu gpu_prep_and_gated_norm_match_cpu gpu_small_batch_linear_matches_cpu gpu_models_match_cpu_and_goldens gpu_packed_prefill_equals_prefilling_each_alone gpu_decode_in_any_slot_order_equals_each_alone gpu_raw_decode_step_equals_prepare_then_step gpu_packed_model_prefill_equals_each_alone gpu_mixed_passes_equal_separate_passes gpu_pruning_calibration_matches_the_cpu gpu_chunk_boundaries_match_cpu gpu_decode_graphs_equal_eager_decode gpu_prefill_graphs_equal_eager_prefill gpu_mixed_graphs_equal_eager_mixed_passes gpu_warm_up_leaves_the_pool_as_it_was gpu_host_tier_round_trips_snapshots_exactly > $L/gpu_tests.log 2>&1
echo "suite rc=$? in $(($(date +%s) - start)) s"; grep -E "^test |GPU tests" $L/gpu_tests.log | tail -30
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 9: after the review's refactors (state slots moved to their own file; one condition for
# the GEMM paths): the tests that run them.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run9.sh $L/run.sh
T="gpu_gemm_f32_output_is_the_unrounded_product gpu_split_projection_slices_sum_to_the_product gpu_split_projections_leave_a_models_logits gpu_decode_graphs_equal_eager_decode gpu_host_tier_round_trips_snapshots_exactly gpu_decode_in_any_slot_order_equals_each_alone gpu_paged_attention_matches_cpu gpu_conv_and_swiglu_match_cpu gpu_mixed_graphs_equal_eager_mixed_passes"
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "GPU tests|FAIL|panicked" $L/tests.log | tail -3
cd $OUT && tar czf logs.tgz logs && rm -rf logs

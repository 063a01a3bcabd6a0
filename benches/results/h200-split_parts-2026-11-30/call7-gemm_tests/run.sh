#!/bin/bash
# Call 7: the GEMM tests after their operands' helper was shared.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run7.sh $L/run.sh
DELTASERVE_TESTS_DIR=$PWD/tests timeout 120 /tmp/n/gpu_tests gpu_gemm_matches_cpu gpu_gemm_f32_output_is_the_unrounded_product gpu_split_projection_slices_sum_to_the_product gpu_split_projections_leave_a_models_logits > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "GPU tests|FAIL|panicked" $L/tests.log | tail -3
cd $OUT && tar czf logs.tgz logs && rm -rf logs

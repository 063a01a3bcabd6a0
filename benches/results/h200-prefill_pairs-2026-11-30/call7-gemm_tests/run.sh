#!/bin/bash
# Session 16, call 7: the GEMM tests on the final test binary (the timing's failures fall back to
# the heuristic's first; outputs over 256 MiB not timed).
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t5.tar.xz
DELTASERVE_TESTS_DIR=$PWD/tests timeout 100 /tmp/n/gpu_tests gpu_tuned_gemm_gives_the_heuristics_bits gpu_gemm_matches_cpu gpu_split_projections_leave_a_models_logits > $OUT/gpu_tests.log 2>&1
echo "rc=$?"; grep -E "GPU tests|FAILED|panicked|differ from|timed" $OUT/gpu_tests.log | tail -12

#!/bin/bash
# Prefill row kernels, call 5: the new GPU test (prefill's row-kernel entries against the few-row
# ones, bit for bit; prep's bf16 q against the CPU) and the prep / decode-step tests beside it.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t3.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run22.sh $L/run.sh
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests gpu_prefill_row_kernels_equal_decode_variants gpu_prep_and_gated_norm_match_cpu gpu_raw_decode_step_equals_prepare_then_step > $L/gpu_tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|prep bf16|301" $L/gpu_tests.log | tail -12
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# The warpgroup state pass against the CPU with an empty sequence in the pack (every K, the
# split-key pass at K = 192 / 256 included), and packed = alone.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t97.tar.xz
SECONDS=0
DELTASERVE_TESTS_DIR=$PWD/tests timeout 120 /tmp/n/gpu_tests gpu_warpgroup_state_pass_matches_cpu gpu_packed_prefill_equals_prefilling_each_alone gpu_two_warpgroup_pass_equals_one --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "^test \|FAILED\|panicked\|warpgroup pass n=\|test result" $L/gpu_tests.log | head -20
cd $OUT && tar czf logs.tgz logs && rm -rf logs

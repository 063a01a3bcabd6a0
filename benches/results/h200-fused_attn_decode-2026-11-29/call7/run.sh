#!/bin/bash
# Call 7: the GPU tests of paged attention (the fused decode kernel bit for bit the append and
# row kernel) and of the decode graphs, on the final test code.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests paged_attention decode_graphs conv_and_swiglu > $OUT/gpu_tests.log 2>&1
echo "rc=$?"; grep -E "GPU tests:|bit for bit the append|panicked" $OUT/gpu_tests.log

#!/bin/bash
# Call 8: the decode graphs' eager and capture-failure paths after the ids' upload moved: the
# decode-graph, model and warm-up GPU tests.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run8.sh $L/run.sh
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests gpu_decode_graphs_equal_eager_decode gpu_models_match_cpu_and_goldens gpu_warm_up_leaves_the_pool_as_it_was gpu_decode_in_any_slot_order_equals_each_alone > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "GPU tests|FAIL|panicked" $L/tests.log | tail -5
cd $OUT && tar czf logs.tgz logs && rm -rf logs

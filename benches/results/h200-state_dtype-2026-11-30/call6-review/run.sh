#!/bin/bash
# Call 6: after review (the host tier copying 16-bit slots as words; formatting): the host-tier
# test (now also gdp with bf16 states), the bf16-state test and the tests around the pool.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run6.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T="gpu_host_tier_round_trips_snapshots_exactly gpu_bf16_states_follow_the_goldens gpu_warm_up_leaves_the_pool_as_it_was gpu_prefix_cache_snapshots_match_whole_prefills gpu_raw_decode_step_equals_prepare_then_step gpu_decode_graphs_equal_eager_decode"
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "GPU tests|FAILED|panicked|host round trip" $L/tests.log | tail -8
cd $OUT && tar czf logs.tgz logs && rm -rf logs

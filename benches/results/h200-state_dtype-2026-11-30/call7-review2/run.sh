#!/bin/bash
# Call 7: after review (the decode step's f32 state accesses through load_cols / store_cols again,
# one copy of each): the tests over the decode step and the models, and the decode steps of both
# state types, one round.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run7.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T="gpu_models_match_cpu_and_goldens gpu_raw_decode_step_equals_prepare_then_step gpu_decode_in_any_slot_order_equals_each_alone gpu_decode_graphs_equal_eager_decode gpu_bf16_states_follow_the_goldens gpu_ops_match_reference gpu_batch_invariant_mode_decode_step_rows_do_not_depend_on_the_batch"
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "GPU tests|FAILED|panicked" $L/tests.log | tail -6
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
B=/tmp/n/gpu_bench
ROUNDS=1 BATCHES=1,64 MODELS=gdn TIMEOUT=90 bash benches/ab_decode.sh $L/ab f32=$B "bf16=$B --state-dtype bf16" > $L/ab.out 2>&1
cat $L/ab/summary.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

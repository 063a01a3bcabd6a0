#!/bin/bash
# Call 1 (2026-11-30 b): the staged prologues' inputs copied into shared memory (cp.async) against
# the register-reading prologues (DELTASERVE_STAGE_COPY=0), and the gated norm folded into o_proj
# for up to 64 head rows (DELTASERVE_GATED_FOLD_ROWS=64), decode steps at batch 1 and 2,
# alternating, two rounds; the fold tests first.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run1.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T="gpu_norm_folded_into_gemv_equals_two_kernels gpu_gated_norm_folded_into_gemv_equals_two_kernels gpu_conv_folded_into_projection_equals_two_kernels gpu_decode_graphs_equal_eager_decode gpu_models_match_cpu_and_goldens gpu_small_batch_linear_matches_cpu gpu_batch_invariant_mode_decode_step_rows_do_not_depend_on_the_batch"
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests $T > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "test result|FAIL|panicked" $L/tests.log | tail -8
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
B=/tmp/n/gpu_bench
ROUNDS=2 BATCHES=1,2 TIMEOUT=90 bash benches/ab_decode.sh $L/ab "regs=DELTASERVE_STAGE_COPY=0 $B" new=$B "regs64=DELTASERVE_STAGE_COPY=0 DELTASERVE_GATED_FOLD_ROWS=64 $B" "new64=DELTASERVE_GATED_FOLD_ROWS=64 $B" > $L/ab.out 2>&1
cat $L/ab/summary.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

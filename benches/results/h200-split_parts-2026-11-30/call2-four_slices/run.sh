#!/bin/bash
# Call 2 (split projections as slices, four slices up to 64 rows, the norm's slice loads issued
# at once): the new GPU tests and the model tests around them; decode steps with the default
# (auto: at least four slices up to 64 rows), cuBLAS's own split as slices (cublas) and every
# projection reduced by its GEMM (off), one binary, alternating, two rounds; Nsight Compute of
# the Qwen3.5 layout's batch-64 step.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run2.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T="gpu_split_projection_slices_sum_to_the_product gpu_split_projections_leave_a_models_logits gpu_decode_graphs_equal_eager_decode gpu_models_match_cpu_and_goldens gpu_mixed_graphs_equal_eager_mixed_passes gpu_batch_invariant_mode_logits_do_not_depend_on_the_batch"
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests $T > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "GPU tests|FAIL|panicked|slices|against f32" $L/tests.log | tail -20
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
B=/tmp/n/gpu_bench
ROUNDS=2 TIMEOUT=90 bash benches/ab_decode.sh $L/ab "off=DELTASERVE_SPLIT_PARTS=0 $B" "cublas=DELTASERVE_SPLIT_PARTS=cublas $B" auto=$B > $L/ab.out 2>&1
cat $L/ab/summary.md
timeout 120 ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw $B --hybrid-dir /tmp/q35 --reps 3 --profile-hybrid-decode 64 > $L/ncu-q35-b64.csv 2> $L/ncu.err
echo "ncu rc=$?"; python3 benches/ncu_kernels.py q35-b64-auto $L/ncu-q35-b64.csv > $L/kernels-q35-b64-auto.md 2>&1; head -32 $L/kernels-q35-b64-auto.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 1 (split projections as slices): the new GPU tests and the model tests around them; the
# GEMMs alone (gemm-algos, with the parts variants); decode steps with slices (on) against every
# projection reduced by its GEMM (off), one binary, alternating, two rounds; Nsight Compute of
# the Qwen3.5 layout's batch-64 step with slices.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run1.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T="gpu_split_projection_slices_sum_to_the_product gpu_split_projections_leave_a_models_logits gpu_gemm_matches_cpu gpu_decode_graphs_equal_eager_decode gpu_models_match_cpu_and_goldens gpu_mixed_graphs_equal_eager_mixed_passes gpu_mixed_passes_equal_separate_passes gpu_prefill_graphs_equal_eager_prefill"
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests $T > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "GPU tests|FAIL|panicked|slices|rel err against" $L/tests.log | tail -30
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
B=/tmp/n/gpu_bench
ROUNDS=2 TIMEOUT=90 bash benches/ab_decode.sh $L/ab "off=DELTASERVE_SPLIT_PARTS=0 $B" on=$B > $L/ab.out 2>&1
cat $L/ab/summary.md
timeout 100 $B --gemm-algos > $L/algos.log 2>&1
echo "algos rc=$?"
python3 - $L/algos.log <<'PY'
import json,sys
for l in open(sys.argv[1]):
    if not l.startswith('ALGO '): continue
    d=json.loads(l[5:])
    if d['n']==2048 and (d['pick']==0 and d['variant'] in ('bf16',) or d['variant'].startswith('parts')):
        print(d['model'],d['name'],d['m'],d['k'],d['variant'],round(d['us'],2))
PY
timeout 120 ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw $B --hybrid-dir /tmp/q35 --reps 3 --profile-hybrid-decode 64 > $L/ncu-q35-b64.csv 2> $L/ncu.err
echo "ncu rc=$?"; python3 benches/ncu_kernels.py q35-b64-parts $L/ncu-q35-b64.csv > $L/kernels-q35-b64-parts.md 2>&1; head -30 $L/kernels-q35-b64-parts.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 3: the streamed GEMVs with x staged in shared memory and the function's opt-in at its
# maximum (the Qwen3.5 layout's graphs were not rebuilt in call 1): GEMV tests, then decode
# steps alternating: o = not streamed, n = streamed, c = streamed with every graph kernel's
# carveout at 100% shared memory (DELTASERVE_CARVEOUT=100), oc = not streamed with it.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run3.sh $L/run.sh
[ -d /tmp/q35 ] || (python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1)
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests streamed norm_folded conv_folded > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests:" $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -20
M=/tmp/gdn13
run() { case $1 in o) DELTASERVE_GEMV_STREAM=0 "${@:2}";; c) DELTASERVE_CARVEOUT=100 "${@:2}";; oc) DELTASERVE_GEMV_STREAM=0 DELTASERVE_CARVEOUT=100 "${@:2}";; *) "${@:2}";; esac; }
for b in o n c oc o n c oc; do
  run $b timeout 25 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 1,2,16 > $L/model-$b.log 2>&1
  echo "gdn $b: $(grep -E '^\| [0-9]+ \| yes' $L/model-$b.log | awk -F'|' '{printf "%s:%s ", $2, $4}') $(grep -o 'programmatic: [0-9]*, note: [^}]*' $L/model-$b.log | head -1)"
done
for b in o n c oc o n c oc; do
  run $b timeout 30 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches 1,2,64 > $L/q35-$b.log 2>&1
  echo "q35 $b: $(grep -o '"batch":[0-9]*,"context":256,"ms":[0-9.]*' $L/q35-$b.log | sed 's/"context":256,//' | tr '\n' ' ') $(grep -o 'programmatic: [0-9]*, note: [^}]*' $L/q35-$b.log | head -1)"
done
NCU="ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw"
for b in o n; do
  run $b timeout 100 $NCU /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches 1 --reps 3 --profile-hybrid-decode 1 > $L/ncu-q35-b1-$b.csv 2> $L/ncu-q35-b1-$b.err
  python3 benches/ncu_kernels.py "Qwen3.5-layout decode step, batch 1 ($b)" $L/ncu-q35-b1-$b.csv > $L/kernels-q35-b1-$b.md 2>&1
  sed -n '/| kernel/,$p' $L/kernels-q35-b1-$b.md | head -9
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Device call: the one-row staged GEMV on a capped grid (LOOP) for W of many rows, by env, in one binary; cublasLt algorithms described.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L/prof
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/build_q35.log 2>&1) &
BUILD=$!
B=/tmp/b/gpu_bench.loop
timeout 100 $B --gemm-algos > $L/algos.log 2>&1
M=/tmp/gdn13
G="--model-only --no-prefill --graphs-only --model-dir $M --batches 1,2"
timeout 150 $B --model-only --no-prefill --graphs-only --model-dir $M --batches 1 > $L/model-warm.log 2>&1
run() { # label env...
  local v=$1; shift
  echo "## round $r $v" >> $L/$F; env "$@" timeout 100 $B $ARGS >> $L/$F 2>&1
}
F=model.log; ARGS=$G
for r in 1 2; do
  run base X=1; run all9k DELTASERVE_STAGED_LOOP_MIN_ROWS=9000; run all9k_b4 DELTASERVE_STAGED_LOOP_MIN_ROWS=9000 DELTASERVE_STAGED_LOOP_BLOCKS=4
done
wait $BUILD
F=hybrid.log; ARGS="--hybrid-dir /tmp/q35 --no-prefill --batches 1,2"
for r in 1 2; do
  run base X=1; run lm6 DELTASERVE_STAGED_LOOP_MIN_ROWS=100000; run lm4 DELTASERVE_STAGED_LOOP_MIN_ROWS=100000 DELTASERVE_STAGED_LOOP_BLOCKS=4
  run lm8 DELTASERVE_STAGED_LOOP_MIN_ROWS=100000 DELTASERVE_STAGED_LOOP_BLOCKS=8; run all9k DELTASERVE_STAGED_LOOP_MIN_ROWS=9000
done
NCU="ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size --csv --page raw"
timeout 100 $NCU $B --hybrid-dir /tmp/q35 --no-prefill --batches 1 --reps 3 --profile-hybrid-decode 1 > $L/prof/ncu-q35-b1.csv 2> $L/prof/ncu-q35-b1.err
DELTASERVE_STAGED_LOOP_MIN_ROWS=100000 timeout 100 $NCU $B --hybrid-dir /tmp/q35 --no-prefill --batches 1 --reps 3 --profile-hybrid-decode 1 > $L/prof/ncu-q35-b1-lm6.csv 2> $L/prof/ncu-q35-b1-lm6.err
for f in $L/prof/*.csv; do python3 benches/ncu_kernels.py "$(basename $f)" $f > ${f%.csv}.md 2>&1; done
grep -E "^## |^\| [0-9]" $L/model.log
grep -E "^## |decode" $L/hybrid.log | sed 's/"batch_invariant":false,//; s/"captured":\[[0-9]*\],"context":256,//; s/,"roofline_ms".*//; s/"graph":"[^"]*",//'
for f in $L/prof/*.csv; do echo "== $f"; grep add_norm_gemv $f | awk -F'","' '{print $0}' | python3 -c "
import sys,csv
for r in csv.reader(sys.stdin):
    print([x for x in r if x][-6:])
" | sort -t, -k1 | tail -4; done
tar -C $L -czf $OUT/loop.tgz .

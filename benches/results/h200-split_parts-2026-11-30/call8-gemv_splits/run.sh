#!/bin/bash
# Call 8: the batch-1 GEMVs' K split (DELTASERVE_GEMV_SPLITS 1 / 2 / 8 against the default rule),
# the Qwen3.5 layout, one binary, alternating, two rounds.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run8.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
B=/tmp/n/gpu_bench
MODELS=q35 BATCHES=1,2 ROUNDS=2 TIMEOUT=60 bash benches/ab_decode.sh $L/ab base=$B "s1=DELTASERVE_GEMV_SPLITS=1 $B" "s2=DELTASERVE_GEMV_SPLITS=2 $B" "s8=DELTASERVE_GEMV_SPLITS=8 $B" > $L/ab.out 2>&1
cat $L/ab/summary.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

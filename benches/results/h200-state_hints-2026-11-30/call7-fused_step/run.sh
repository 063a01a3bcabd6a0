#!/bin/bash
# Call 7: with the states streaming, settings that lost before: the 1.39B's fused step (q/k
# normalised, β and the gate formed in the step's kernel) up to 64 rows or only up to 8 (default
# 16), and the Qwen3.5 layout's other K = 128 step shapes; one binary (call 3's), alternating, two
# rounds, ms a step (its % use call 3's roofline copy, timed from an idle GPU).
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run7.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
B=/tmp/n/gpu_bench
MODELS=gdn ROUNDS=2 TIMEOUT=100 bash benches/ab_decode.sh $L/gdn base=$B "f64=DELTASERVE_FUSED_STEP_MAX_BATCH=64 $B" "f8=DELTASERVE_FUSED_STEP_MAX_BATCH=8 $B" > $L/gdn.out 2>&1
cat $L/gdn/summary.md
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
MODELS=q35 ROUNDS=2 TIMEOUT=100 bash benches/ab_decode.sh $L/q35 base=$B "w8r16b2=DELTASERVE_DECODE_KERNEL=w8_r16_c4_b2 $B" "w16r8b1=DELTASERVE_DECODE_KERNEL=w16_r8_c4_b1 $B" > $L/q35.out 2>&1
cat $L/q35/summary.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

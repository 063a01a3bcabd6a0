#!/usr/bin/env bash
# The Qwen3.5-2B layout's mixed passes, eager against graph (b149), with vocabulary 4,096: the
# logits a pass copies to the host shrink 60-fold, so the rows with 32 and 64 decode rows time
# the passes, not the copies (run with 248,320 in call 2).
L=$OUT/logs; mkdir -p $L /tmp/n; cp .devbuild/run151.sh $L/run.sh
tar -C /tmp/n -xJf .devbuild/b149.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
M=/tmp/q35-v4096
python3 -c "import sys; sys.path.insert(0, 'benches'); import hybrid_vs_hf as h; h.build('$M', vocab_size=4096, eos_token_id=2)" > $L/q35_build.log 2>&1
echo "model at ${SECONDS}s"
timeout 150 /tmp/n/gpu_bench --hybrid-dir $M --mixed-passes --reps 10 > $L/q35v4096_mixed.md 2>&1; echo "mixed rc $? at ${SECONDS}s"
grep "|" $L/q35v4096_mixed.md; grep -m3 -i "error" $L/q35v4096_mixed.md

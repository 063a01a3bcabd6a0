#!/usr/bin/env bash
# Where the MoE hybrid's prefill goes (b154 = HEAD b6c3e4d): Qwen3.5-35B-A3B's layer shapes cut to
# 8 layers (benches/hybrid_vs_hf.py --moe: transformers' own init), transformers 5.17 + fla 0.6.0
# against gpu_bench in one run; then the T=4096 bf16 prefill under Nsight Compute by kernel.
L=$OUT/logs; mkdir -p $L /tmp/n; cp .devbuild/run155.sh $L/run.sh
tar -C /tmp/n -xJf .devbuild/b154.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl > $L/pip.log 2>&1
M=/tmp/deltaserve-qwen3_5_moe
PYTHONPATH=$FLA timeout 330 python3 benches/hybrid_vs_hf.py --moe --bench-bin /tmp/n/gpu_bench --reps 10 > $L/moe_vs_hf.log 2>&1
echo "moe_vs_hf rc $? at ${SECONDS}s"; grep "^|\|^##\|HF " $L/moe_vs_hf.log | tail -14
timeout 220 bash benches/hybrid_profile.sh --prefill /tmp/n/gpu_bench $M $L/prof > $L/prof.log 2>&1
echo "prof rc $? at ${SECONDS}s"; head -50 $L/prof/kernels-prefill.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

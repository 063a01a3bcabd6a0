#!/bin/bash
# Session 17, call 5: the final build's Qwen3.5 layout against transformers 5.17 + fla 0.6.0 in
# the same call (benches/hybrid_vs_hf.py: prefill T=4096, decode at batch 1 and 64).
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/c4.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run35.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl > $L/pip.log 2>&1; echo "pip rc=$?"
s=$(date +%s)
PYTHONPATH=$FLA timeout 330 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1
echo "hybrid rc=$? $(( $(date +%s) - s )) s"; tail -10 $L/hybrid_vs_hf.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Device call: the chat workload with and without the prefix cache (1.39B GDN), then the Qwen3.5 layout against transformers + fla in one run, on the H200.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
ROUNDS=2 CONVS="1 8" TURNS=8 timeout 330 bash benches/prefix_cache_chat.sh /tmp/b/loadgen $L/chat this=/tmp/b/deltaserve > $L/chat.log 2>&1
echo chat rc=$?
FLA=$(mktemp -d); pip install --quiet --no-deps --no-index --target "$FLA" .devbuild/whl/*.whl > $L/pip.log 2>&1
PYTHONPATH="$FLA" timeout 240 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/b/gpu_bench.final --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1
echo hf rc=$?
tail -12 $L/hybrid_vs_hf.log
grep -E "^## |^\| [0-9]" $L/chat/chat.md | head -40

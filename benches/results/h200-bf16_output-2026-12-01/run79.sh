#!/usr/bin/env bash
# This build against transformers 5.17 + fla 0.6.0 in one call: the 1.39B's T=4096 prefill
# (fla_prefill.py, median of 20) beside ours, and the Qwen3.5 layout (hybrid_vs_hf.py).
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/n29.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
FLA=$(mktemp -d); pip install --quiet --no-deps --no-index --target "$FLA" .whl/*.whl 2>/dev/null
timeout 90 /tmp/n/gpu_bench --model-only --batches 1 --graphs-only > $L/model-0.md 2>&1; echo "model 0 rc $? at ${SECONDS}s"
PYTHONPATH=$FLA timeout 200 python3 benches/fla_prefill.py /tmp/deltaserve-gdn-1.3b $L/fla_prefill.json 4096 20 > $L/fla_prefill.log 2>&1; echo "fla_prefill rc $? at ${SECONDS}s"; tail -2 $L/fla_prefill.log
for r in 1 2; do
  timeout 60 /tmp/n/gpu_bench --model-only --batches 1 --graphs-only > $L/model-$r.md 2>&1; grep -i "^prefill" $L/model-$r.md
done
PYTHONPATH=$FLA timeout $((580 - SECONDS)) python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1; echo "hybrid rc $? at ${SECONDS}s"; tail -9 $L/hybrid_vs_hf.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 4: the Qwen3.5 layout against transformers (benches/hybrid_vs_hf.py, this build), then
# main's and this build's gpu_bench on the same checkpoint, alternating.
mkdir -p /tmp/m /tmp/b && tar -C /tmp/m -xJf .devbuild/main.tar.xz && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run4.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl 2>/dev/null
s=$(date +%s)
PYTHONPATH=$FLA timeout 300 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/b/gpu_bench --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1
echo "hybrid rc=$? $(( $(date +%s) - s )) s"; tail -7 $L/hybrid_vs_hf.log
i=0
for b in m b m b; do
  i=$((i+1))
  timeout 90 /tmp/$b/gpu_bench --hybrid-dir /tmp/q35 --batches 1 > $L/hybrid-$b-$i.log 2>&1
  echo "hybrid $b rc=$?"; grep -E "^OURS" $L/hybrid-$b-$i.log | cut -c1-160
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

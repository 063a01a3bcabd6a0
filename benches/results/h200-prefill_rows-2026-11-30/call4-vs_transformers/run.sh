#!/bin/bash
# Prefill row kernels, call 4: the final build against transformers + fla in the same call (the
# Qwen3.5 layout by benches/hybrid_vs_hf.py; the 1.39B's prefill by benches/fla_prefill.py),
# with HEAD's and the final build's 1.39B prefill around fla's.
mkdir -p /tmp/n /tmp/b && tar -C /tmp/n -xJf .devbuild/n2.tar.xz && tar -C /tmp/b -xJf .devbuild/b0.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run21.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl > $L/pip.log 2>&1; echo "pip rc=$?"
s=$(date +%s)
PYTHONPATH=$FLA timeout 300 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1
echo "hybrid rc=$? $(( $(date +%s) - s )) s"; tail -8 $L/hybrid_vs_hf.log
s=$(date +%s)
timeout 90 /tmp/b/gpu_bench --model-only --reps 3 > $L/gdn-base-1.log 2>&1
timeout 90 /tmp/n/gpu_bench --model-only --reps 3 > $L/gdn-new-1.log 2>&1
PYTHONPATH=$FLA timeout 150 python3 benches/fla_prefill.py /tmp/deltaserve-gdn-1.3b $L/fla_prefill.json 4096 20 > $L/fla_prefill.log 2>&1
echo "fla_prefill rc=$? $(( $(date +%s) - s )) s"; tail -1 $L/fla_prefill.log
timeout 90 /tmp/b/gpu_bench --model-only --reps 3 > $L/gdn-base-2.log 2>&1
timeout 90 /tmp/n/gpu_bench --model-only --reps 3 > $L/gdn-new-2.log 2>&1
for f in $L/gdn-*.log; do echo "$(basename $f): $(grep '^prefill B=1, T=4096' $f | sed 's/  */ /g' | cut -c1-100 | tr '\n' '|')"; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

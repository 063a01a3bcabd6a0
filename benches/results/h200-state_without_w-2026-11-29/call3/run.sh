#!/bin/bash
# Call 3: R as a bf16 pair (this build, /tmp/b) against R rounded (/tmp/n) and main (/tmp/m):
# GPU suite; mixer tables; transformers + fla's 1.39B prefill beside ours; the Qwen3.5 layout.
mkdir -p /tmp/m /tmp/b /tmp/n && tar -C /tmp/m -xJf .devbuild/main.tar.xz && tar -C /tmp/b -xJf .devbuild/bins.tar.xz && tar -C /tmp/n -xJf .devbuild/norlo.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run7.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep "GPU tests:" $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -20; grep "bf16 q/k/v" $L/gpu_tests.log
for b in n b m; do
  timeout 60 /tmp/$b/gpu_bench --skip-model > $L/mixers-$b.md 2>&1
  echo "mixers $b rc=$?"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/mixers-$b.md
done
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl 2>/dev/null
timeout 60 /tmp/b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-b0.md 2>&1   # writes the checkpoint
s=$(date +%s)
PYTHONPATH=$FLA timeout 200 python3 benches/fla_prefill.py /tmp/deltaserve-gdn-1.3b $L/fla_prefill.json 4096 20 > $L/fla_prefill.log 2>&1
echo "fla_prefill rc=$? $(( $(date +%s) - s )) s"; tail -1 $L/fla_prefill.log
for b in m b n m b; do
  timeout 60 /tmp/$b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-$b.md 2>&1
  echo "model $b rc=$?"; grep -i "^prefill" $L/model-$b.md
done
s=$(date +%s)
PYTHONPATH=$FLA timeout 170 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/b/gpu_bench --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1
echo "hybrid rc=$? $(( $(date +%s) - s )) s"; tail -7 $L/hybrid_vs_hf.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

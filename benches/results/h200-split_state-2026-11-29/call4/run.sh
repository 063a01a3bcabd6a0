#!/bin/bash
# Device call 4 (final build): GPU suite; mixer tables of main and this build; the 1.39B's
# prefill T=4096 (main and this build alternating) beside transformers + fla; the Qwen3.5 layout
# against transformers (benches/hybrid_vs_hf.py).
mkdir -p /tmp/m /tmp/b && tar -C /tmp/m -xJf .devbuild/main.tar.xz && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run4.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; tail -1 $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -20
for b in m b; do
  timeout 60 /tmp/$b/gpu_bench --skip-model > $L/mixers-$b.md 2>&1
  echo "mixers $b rc=$?"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/mixers-$b.md
done
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl 2>/dev/null
timeout 60 /tmp/b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-b0.md 2>&1   # writes the checkpoint
s=$(date +%s)
PYTHONPATH=$FLA timeout 200 python3 benches/fla_prefill.py /tmp/deltaserve-gdn-1.3b $L/fla_prefill.json 4096 20 > $L/fla_prefill.log 2>&1
echo "fla_prefill rc=$? $(( $(date +%s) - s )) s"; tail -1 $L/fla_prefill.log
for b in m b m b; do
  timeout 60 /tmp/$b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-$b.md 2>&1
  echo "model $b rc=$?"; grep -i "^prefill" $L/model-$b.md
done
PYTHONPATH=$FLA timeout 60 python3 benches/fla_prefill.py /tmp/deltaserve-gdn-1.3b $L/fla_prefill2.json 4096 20 > $L/fla_prefill2.log 2>&1
echo "fla_prefill2 rc=$?"; tail -1 $L/fla_prefill2.log
s=$(date +%s)
PYTHONPATH=$FLA timeout 200 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/b/gpu_bench --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1
echo "hybrid rc=$? $(( $(date +%s) - s )) s"; tail -7 $L/hybrid_vs_hf.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

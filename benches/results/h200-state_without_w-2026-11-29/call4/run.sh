#!/bin/bash
# Call 4, the final build (its gpu_bench byte-identical to call 2's /tmp/b): fla's mixer in the
# same run; transformers + fla's 1.39B prefill beside main and this build; the Qwen3.5 layout.
mkdir -p /tmp/m /tmp/b && tar -C /tmp/m -xJf .devbuild/main.tar.xz && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run8.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
timeout 220 bash benches/mixer_vs_fla.sh /tmp/b/gpu_bench $L/fla > $L/mixer_vs_fla.log 2>&1
echo "mixer_vs_fla rc=$? $(( $(date +%s) - s )) s"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/fla/gpu_bench_mixers.md
timeout 60 /tmp/m/gpu_bench --skip-model > $L/mixers-m.md 2>&1; echo "mixers m rc=$?"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/mixers-m.md
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl 2>/dev/null
timeout 60 /tmp/b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-b0.md 2>&1   # writes the checkpoint
s=$(date +%s)
PYTHONPATH=$FLA timeout 150 python3 benches/fla_prefill.py /tmp/deltaserve-gdn-1.3b $L/fla_prefill.json 4096 20 > $L/fla_prefill.log 2>&1
echo "fla_prefill rc=$? $(( $(date +%s) - s )) s"; tail -1 $L/fla_prefill.log
for b in m b m b; do
  timeout 60 /tmp/$b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-$b.md 2>&1
  echo "model $b rc=$?"; grep -i "^prefill" $L/model-$b.md
done
s=$(date +%s)
PYTHONPATH=$FLA timeout 170 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/b/gpu_bench --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1
echo "hybrid rc=$? $(( $(date +%s) - s )) s"; tail -7 $L/hybrid_vs_hf.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

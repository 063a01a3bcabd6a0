#!/bin/bash
# Call 4: this build's mixer against fla in one run, and its 1.39B prefill T=4096 against
# transformers + fla (head and new alternating for ours).
mkdir -p /tmp/h /tmp/b && tar -C /tmp/h -xJf .devbuild/head.tar.xz && tar -C /tmp/b -xJf .devbuild/new.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run4.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
timeout 280 bash benches/mixer_vs_fla.sh /tmp/b/gpu_bench $L/fla > $L/mixer_vs_fla.log 2>&1
echo "mixer_vs_fla rc=$? $(( $(date +%s) - s )) s"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/fla/gpu_bench_mixers.md
timeout 60 /tmp/h/gpu_bench --prefill-mixer-only > $L/mixers-h.md 2>&1; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/mixers-h.md | head -4
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl 2>/dev/null
timeout 80 /tmp/b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-b0.md 2>&1   # writes the checkpoint
s=$(date +%s)
PYTHONPATH=$FLA timeout 150 python3 benches/fla_prefill.py /tmp/deltaserve-gdn-1.3b $L/fla_prefill.json 4096 20 > $L/fla_prefill.log 2>&1
echo "fla_prefill rc=$? $(( $(date +%s) - s )) s"; tail -1 $L/fla_prefill.log
for b in h b h b; do
  timeout 60 /tmp/$b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-$b.md 2>&1
  echo "model $b rc=$?"; grep -i "^prefill" $L/model-$b.md
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

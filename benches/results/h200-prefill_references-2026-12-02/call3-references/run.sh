#!/usr/bin/env bash
# References for the 1.39B in one call (b144: HEAD's kernels, gpu_bench with --prefill-graph):
# its T=4096 prefills and decode steps; transformers 5.17 + fla 0.6.0's forward of the same
# checkpoint (benches/fla_prefill.py, 20 timed); the mixer tables against fla in the same run.
L=$OUT/logs; mkdir -p $L /tmp/n; cp .devbuild/run145.sh $L/run.sh
tar -C /tmp/n -xJf .devbuild/b144.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
timeout 150 /tmp/n/gpu_bench --model-only --prefill-graph --reps 5 > $L/gdn.md 2>&1; echo "gdn rc $? at ${SECONDS}s"
grep -i "^prefill\|prefill_graph\|^| 1 \|^| 16 \|^| 64 " $L/gdn.md
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl > $L/pip.log 2>&1
PYTHONPATH=$FLA timeout 150 python3 benches/fla_prefill.py /tmp/deltaserve-gdn-1.3b $L/fla_prefill.json 4096 20 > $L/fla_prefill.log 2>&1; echo "fla_prefill rc $? at ${SECONDS}s"; tail -2 $L/fla_prefill.log
timeout 300 bash benches/mixer_vs_fla.sh /tmp/n/gpu_bench $L/mixer > $L/mixer.out 2>&1; echo "mixer rc $? at ${SECONDS}s"
grep "fla\||" $L/mixer/gpu_bench_mixers.md | head -40
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# The serving sweep on the H200 with this build (e93041b): the bare decode steps, then
# benches/serving_sweep.sh at concurrency 1, 8, 32, 64, 128 and 256 (512-token prompts,
# 256-token outputs) and transformers 5.17 + fla 0.6.0 with static batches of 1, 8, 32 and 64 on
# the same checkpoint (benches/hf_static.py), plotted together.
L=$OUT/logs; mkdir -p $L/sweep /tmp/n
tar -C /tmp/n -xJf .devbuild/b99.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
V=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
/tmp/n/deltaserve init-random --config $L/config.json -o $V --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
timeout 120 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $V --batches 1,8,32,64,128,256 > $L/bare.log 2>&1
grep -E '^\| [0-9]+ \| yes' $L/bare.log; echo "bare at ${SECONDS}s"
MODEL=$V timeout 300 bash benches/serving_sweep.sh /tmp/n/deltaserve /tmp/n/serve_bench $L/sweep > $L/sweep.log 2>&1; echo "sweep rc $? at ${SECONDS}s"
cat $L/sweep/table.md
FLA=$(mktemp -d); pip install --quiet --no-deps --no-index --target "$FLA" .whl/*.whl 2>/dev/null
PYTHONPATH=$FLA timeout $((560 - SECONDS)) python3 benches/hf_static.py $V $L/sweep 1 8 32 64 > $L/hf_static.log 2>&1; echo "hf rc $? at ${SECONDS}s"; tail -6 $L/hf_static.log
python3 benches/plot_serving.py $L/sweep $L/sweep/serving.svg > $L/plot.log 2>&1; echo "plot rc $?"
rm -f $L/sweep/serve-cuda.log.big
cd $OUT && tar czf logs.tgz logs && rm -rf logs

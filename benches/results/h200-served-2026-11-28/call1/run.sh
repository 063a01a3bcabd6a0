#!/bin/bash
# Device call: the served 1.39B (vocabulary 4,096) on the H200 with this build: the bare decode
# steps, serving at concurrency 1/16/64/64, and long prompts arriving under 32 streams.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
s=$(date +%s.%N)
/tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
echo "init-random rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s" | tee -a $L/init.log
timeout 70 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 1,16,32,64 > $L/bare.log 2>&1
echo bare rc=$?; grep -E "^\| [0-9]" $L/bare.log
MODEL=$M timeout 110 bash benches/serving_sweep.sh /tmp/b/deltaserve /tmp/b/serve_bench $L/sweep 1 16 64 64 > $L/sweep.log 2>&1
echo sweep rc=$?; cat $L/sweep/table.md
MODEL=$M timeout 75 bash benches/long_prompts.sh /tmp/b/serve_bench $L/long this=/tmp/b/deltaserve > $L/long.log 2>&1
echo long rc=$?; cat $L/long/table.md

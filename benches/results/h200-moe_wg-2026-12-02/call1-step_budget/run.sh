#!/usr/bin/env bash
# The GPU's step budget at 1,024 (the default) against 2,048 with mixed graphs to 2,048 (b154 =
# HEAD b6c3e4d): the served 1.39B (vocabulary 4,096), 64 streams of 512-token prompts and 256-token
# outputs, alternating, two rounds; long prompts beside 32 streams; the chat mix at 4 requests a
# second; the bare steps before and after.
L=$OUT/logs; mkdir -p $L /tmp/n; cp .devbuild/run154.sh $L/run.sh
tar -C /tmp/n -xJf .devbuild/b154.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c = json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size'] = 4096; json.dump(c, open('$L/config.json', 'w'))"
/tmp/n/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1 || { cat $L/init.log; exit 1; }
timeout 60 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 32,64 > $L/bare1.log 2>&1
grep -a "batch\|roofline" $L/bare1.log | tail -6
printf '#!/bin/sh\nexec /tmp/n/deltaserve "$@" --max-num-batched-tokens 1024\n' > /tmp/n/b1024; chmod +x /tmp/n/b1024
printf '#!/bin/sh\nexec /tmp/n/deltaserve "$@" --max-num-batched-tokens 2048 --mixed-graph-tokens 2048\n' > /tmp/n/b2048; chmod +x /tmp/n/b2048
C=64 ROUNDS=2 MODEL=$M READY_SECS=200 timeout 420 bash benches/ab_serving.sh /tmp/n/b1024 /tmp/n/b2048 /tmp/n/serve_bench $L/served > $L/served.log 2>&1
echo "served rc $? at ${SECONDS}s"; cat $L/served/ab.md
grep -h "warm-up\|warmed\|captured" $L/served/serve-*-1.log | head -4
MODEL=$M READY_SECS=200 timeout 240 bash benches/long_prompts.sh /tmp/n/serve_bench $L/long b1024=/tmp/n/b1024 b2048=/tmp/n/b2048 > $L/long.log 2>&1
echo "long rc $? at ${SECONDS}s"; cat $L/long/table.md
timeout 60 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 32,64 > $L/bare2.log 2>&1
grep -a "batch\|roofline" $L/bare2.log | tail -6
echo "done at ${SECONDS}s"

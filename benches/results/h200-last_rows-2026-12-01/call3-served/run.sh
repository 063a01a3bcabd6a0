#!/usr/bin/env bash
# Served 1.39B (vocabulary 4,096), 64 streams of 512-token prompts and 256-token outputs: the last
# block at the logits' rows off (DELTASERVE_LAST_ROWS=0) and on in turn, two rounds
# (ab_serving.sh), beside the bare batch-64 step in the same call.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/b99.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
V=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $V/config.json ] || /tmp/n/deltaserve init-random --config $L/config.json -o $V --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
timeout 90 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $V --batches 64 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s: %.4f ms %s tok/s ", $2, 1000*$2/$5, $5}') at ${SECONDS}s"
printf '#!/bin/sh\nDELTASERVE_LAST_ROWS=0 exec /tmp/n/deltaserve "$@"\n' > /tmp/off.sh; chmod +x /tmp/off.sh
C=64 ROUNDS=2 MODEL=$V timeout $((560 - SECONDS)) bash benches/ab_serving.sh /tmp/off.sh /tmp/n/deltaserve /tmp/n/serve_bench $L/serve > $L/serve.log 2>&1; echo "serve rc $? at ${SECONDS}s"
cat $L/serve/ab.md
rm -f $L/serve/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 4: long prompts (4,096 tokens at 2 a second) under 32 streams, --long-prefill-chunk 256
# (the default, n) against 128 (c128), alternating, two rounds each, with the bare batch-32 step.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run4.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $M/config.json ] || /tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@"\n' > /tmp/b/n; chmod +x /tmp/b/n
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --long-prefill-chunk 128\n' > /tmp/b/c128; chmod +x /tmp/b/c128
timeout 200 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 32 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s:%s ", $2, $4}')"
MODEL=$M timeout 400 bash benches/long_prompts.sh /tmp/b/serve_bench $L/long n1=/tmp/b/n c128a=/tmp/b/c128 n2=/tmp/b/n c128b=/tmp/b/c128 > $L/long.log 2>&1
echo "long rc=$?"; grep "ITL after\|long-prompts |" $L/long/table.md
rm -f $L/serve-*.log $L/long/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

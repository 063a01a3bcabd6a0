#!/bin/bash
# Call 6: long prompts under 32 streams with this build: the defaults (n) and
# --long-prefill-chunk 128 (c128), one round each; the bare batch-32 step beside them.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run6.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $M/config.json ] || /tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@"\n' > /tmp/b/n; chmod +x /tmp/b/n
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --long-prefill-chunk 128\n' > /tmp/b/c128; chmod +x /tmp/b/c128
timeout 120 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 32 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s:%s ", $2, $4}')"
MODEL=$M timeout 300 bash benches/long_prompts.sh /tmp/b/serve_bench $L/long n=/tmp/b/n c128=/tmp/b/c128 > $L/long.log 2>&1
echo "long rc=$?"; grep "ITL after\|long-prompts |" $L/long/table.md
rm -f $L/long/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

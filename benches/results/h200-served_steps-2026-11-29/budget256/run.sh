#!/bin/bash
# Call 10: the step budget at 64 streams: the default (512 tokens a step) against
# --max-num-batched-tokens 256, which keeps long prompts' pieces beside 32 streams near 2x the
# bare step; 512-token prompts, 256-token outputs, two runs each.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run10.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --max-num-batched-tokens 256\n' > /tmp/b/b256
chmod +x /tmp/b/b256
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $M/config.json ] || /tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
timeout 60 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 64 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s:%s ", $2, $4}')"
MODEL=$M C=64 ROUNDS=2 timeout 250 bash benches/ab_serving.sh /tmp/b/deltaserve /tmp/b/b256 /tmp/b/serve_bench $L/ab > $L/ab.log 2>&1
echo "ab rc=$?"; cat $L/ab/ab.md
rm -f $L/ab/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

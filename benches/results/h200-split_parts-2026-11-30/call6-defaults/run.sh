#!/bin/bash
# Call 6 (the build at HEAD): long prompts under 32 streams at the defaults (n: 128 tokens a step
# on a GPU) and with --long-prefill-chunk 512 (the default before), beside the bare batch-32 step;
# the served 1.39B (vocabulary 4,096) at 1, 16 and 64 streams beside its bare steps.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run6.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $M/config.json ] || /tmp/n/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
printf '#!/bin/sh\nexec /tmp/n/deltaserve "$@" --long-prefill-chunk 512\n' > /tmp/n/c512; chmod +x /tmp/n/c512
timeout 90 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 1,16,32,64 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s: %s ms %s tok/s; ", $2, $4, $5}')"
MODEL=$M timeout 230 bash benches/long_prompts.sh /tmp/n/serve_bench $L/long n=/tmp/n/deltaserve c512=/tmp/n/c512 > $L/long.log 2>&1
echo "long rc=$?"; grep "ITL after\|long-prompts |" $L/long/table.md
rm -f $L/long/serve-*.log
MODEL=$M timeout 200 bash benches/serving_sweep.sh /tmp/n/deltaserve /tmp/n/serve_bench $L/sweep 1 16 64 > $L/sweep.log 2>&1
echo "sweep rc=$?"; cat $L/sweep/table.md; rm -f $L/sweep/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

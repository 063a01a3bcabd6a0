#!/bin/bash
# Call 3: a GPU's default step budget 1024, with prompts longer than it capped at 256 tokens a
# step while streams decode (--long-prefill-chunk). n = the new defaults; o = the defaults
# before (--max-num-batched-tokens 512 --long-prefill-chunk 0); c192 = --long-prefill-chunk 192.
# 64 streams of 512-token prompts (two rounds, alternating) against the bare batch-64 step, then
# long prompts (4,096 tokens at 2 a second) under 32 streams.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run3.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $M/config.json ] || /tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --max-num-batched-tokens 512 --long-prefill-chunk 0\n' > /tmp/b/o; chmod +x /tmp/b/o
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@"\n' > /tmp/b/n; chmod +x /tmp/b/n
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --long-prefill-chunk 192\n' > /tmp/b/c192; chmod +x /tmp/b/c192
s=$(date +%s)
timeout 200 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 32,64 > $L/bare.log 2>&1
echo "bare ($(( $(date +%s) - s )) s): $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s:%s ", $2, $4}')"
source scripts/serve-common.sh
port=18900
for round in 1 2; do
  for t in n o; do
    port=$((port + 1))
    start_server /tmp/b/$t $port $L/serve-$t-$round.log --model $M --device cuda --dtype bf16 --max-num-seqs 256 --max-model-len 4096 --max-queue 4096
    pid=$server_pid
    /tmp/b/serve_bench --url http://127.0.0.1:$port --num-prompts 16 --input-len 512 --output-len 32 --max-concurrency 16 --label warmup > /dev/null
    /tmp/b/serve_bench --url http://127.0.0.1:$port --num-prompts 256 --input-len 512 --output-len 256 --max-concurrency 64 \
      --label "c64-$t-$round" --json $L/c64-$t-$round.json | tail -1 | tee -a $L/c64.md
    kill $pid; wait $pid 2>/dev/null
  done
done
MODEL=$M timeout 280 bash benches/long_prompts.sh /tmp/b/serve_bench $L/long n=/tmp/b/n o=/tmp/b/o c192=/tmp/b/c192 > $L/long.log 2>&1
echo "long rc=$?"; grep -v "long-prompts |" $L/long/table.md; grep "long-prompts |" $L/long/table.md
rm -f $L/serve-*.log $L/long/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

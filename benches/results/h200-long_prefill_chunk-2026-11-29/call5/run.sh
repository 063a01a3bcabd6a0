#!/bin/bash
# Call 5: the new defaults on a GPU (step budget 1024; prompts longer than it capped at 128
# tokens a step while streams outnumber them). Long prompts under 32 streams (two rounds), 64
# streams of 512-token prompts (two rounds) against the bare steps; the chat workload (8
# conversations, 8 turns) with the cache and without, the new defaults (n) against the old
# (o: --max-num-batched-tokens 512 --long-prefill-chunk 0).
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run5.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $M/config.json ] || /tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@"\n' > /tmp/b/n; chmod +x /tmp/b/n
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --max-num-batched-tokens 512 --long-prefill-chunk 0\n' > /tmp/b/o; chmod +x /tmp/b/o
timeout 200 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 32,64 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s:%s ", $2, $4}')"
MODEL=$M timeout 200 bash benches/long_prompts.sh /tmp/b/serve_bench $L/long n1=/tmp/b/n n2=/tmp/b/n > $L/long.log 2>&1
echo "long rc=$?"; grep "ITL after\|long-prompts |" $L/long/table.md
source scripts/serve-common.sh
port=18900
for round in 1 2; do
  port=$((port + 1))
  start_server /tmp/b/n $port $L/serve-c64-$round.log --model $M --device cuda --dtype bf16 --max-num-seqs 256 --max-model-len 4096 --max-queue 4096
  pid=$server_pid
  /tmp/b/serve_bench --url http://127.0.0.1:$port --num-prompts 16 --input-len 512 --output-len 32 --max-concurrency 16 --label warmup > /dev/null
  /tmp/b/serve_bench --url http://127.0.0.1:$port --num-prompts 256 --input-len 512 --output-len 256 --max-concurrency 64 \
    --label "c64-n-$round" --json $L/c64-n-$round.json | tail -1 | tee -a $L/c64.md
  kill $pid; wait $pid 2>/dev/null
done
MODEL=/tmp/chat-1.3b ROUNDS=1 CONVS="8" TURNS=8 MODES="cache nocache" timeout 300 bash benches/prefix_cache_chat.sh /tmp/b/loadgen $L/chat n=/tmp/b/n o=/tmp/b/o > $L/chat.log 2>&1
echo "chat rc=$?"; grep -E "^## |turns 2" $L/chat/chat.md
rm -f $L/serve-*.log $L/long/serve-*.log $L/chat/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

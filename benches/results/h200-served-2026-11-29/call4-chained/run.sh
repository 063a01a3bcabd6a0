#!/bin/bash
# Call 6: every decode step's emit overlapped (the step after one launched ahead launched ahead
# in turn, "chain") against `main`'s `--decode-ahead` ("old") and the default ("plain"): served at
# concurrency 64, two rounds, alternating; then the chat workload (8 conversations, 8 turns) with
# the cache and without, plain against chain.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz && xz -dc .devbuild/loadgen.xz > /tmp/b/loadgen && xz -dc .devbuild/chain.xz > /tmp/b/deltaserve-chain && chmod +x /tmp/b/loadgen /tmp/b/deltaserve-chain
L=$OUT/logs; mkdir -p $L; cp .devbuild/run6.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --decode-ahead\n' > /tmp/b/old; printf '#!/bin/sh\nexec /tmp/b/deltaserve-chain "$@" --decode-ahead\n' > /tmp/b/chain
ln -sf /tmp/b/deltaserve /tmp/b/plain; chmod +x /tmp/b/old /tmp/b/chain
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
/tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
timeout 30 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 64 > $L/bare.log 2>&1
grep -E "^\| [0-9]" $L/bare.log
source scripts/serve-common.sh
port=18900
for round in 1 2; do for v in plain old chain; do
  port=$((port + 1))
  start_server /tmp/b/$v $port $L/serve-$v-$round.log --model $M --device cuda --dtype bf16 --max-num-seqs 256 --max-model-len 4096 --max-queue 4096
  /tmp/b/serve_bench --url http://127.0.0.1:$port --num-prompts 16 --input-len 512 --output-len 32 --max-concurrency 16 --label warmup > /dev/null
  /tmp/b/serve_bench --url http://127.0.0.1:$port --num-prompts 256 --input-len 512 --output-len 256 --max-concurrency 64 --label $v-$round --json $L/$v-$round.json | tail -1 | tee -a $L/ab.md
  kill $server_pid; wait $server_pid 2>/dev/null
done; done
rm -f $L/serve-*.log
MODEL=/tmp/chat-1.3b ROUNDS=1 CONVS="8" TURNS=8 timeout 200 bash benches/prefix_cache_chat.sh /tmp/b/loadgen $L/chat plain=/tmp/b/deltaserve chain=/tmp/b/chain > $L/chat.log 2>&1
echo "chat rc=$?"; grep -E "^## |turns 2" $L/chat/chat.md
rm -f $L/chat/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

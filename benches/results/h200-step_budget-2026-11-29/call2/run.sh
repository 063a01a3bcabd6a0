#!/bin/bash
# Call 5: at --max-num-batched-tokens 1024, mixed passes replayed from CUDA graphs up to 1,024
# prompt tokens (--mixed-graph-tokens 1024) against the default 512 (passes past it eager): 64
# streams of 512-token prompts, two rounds in turn; long prompts under 32 streams with both.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run5.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $M/config.json ] || /tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --max-num-batched-tokens 1024\n' > /tmp/b/b1024; chmod +x /tmp/b/b1024
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --max-num-batched-tokens 1024 --mixed-graph-tokens 1024\n' > /tmp/b/b1024g; chmod +x /tmp/b/b1024g
timeout 60 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 32,64 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s:%s ", $2, $4}')"
source scripts/serve-common.sh
port=18900
for round in 1 2; do
  for t in b1024 b1024g; do
    port=$((port + 1))
    start_server /tmp/b/$t $port $L/serve-$t-$round.log --model $M --device cuda --dtype bf16 --max-num-seqs 256 --max-model-len 4096 --max-queue 4096
    pid=$server_pid
    /tmp/b/serve_bench --url http://127.0.0.1:$port --num-prompts 16 --input-len 512 --output-len 32 --max-concurrency 16 --label warmup > /dev/null
    /tmp/b/serve_bench --url http://127.0.0.1:$port --num-prompts 256 --input-len 512 --output-len 256 --max-concurrency 64 \
      --label "$t-$round" --json $L/$t-$round.json | tail -2 | tee -a $L/c64.md
    kill $pid; wait $pid 2>/dev/null
  done
done
MODEL=$M timeout 200 bash benches/long_prompts.sh /tmp/b/serve_bench $L/long b1024=/tmp/b/b1024 b1024g=/tmp/b/b1024g > $L/long.log 2>&1
echo "long rc=$?"; cat $L/long/table.md
rm -f $L/serve-*.log $L/long/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

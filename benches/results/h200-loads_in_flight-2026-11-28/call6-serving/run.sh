#!/bin/bash
# Device call: served throughput of this build against its bare decode step, same checkpoint
# (1.39B shape, vocabulary 4,096), one call; short (little device time left).
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
source scripts/serve-common.sh
MODEL=/tmp/v4096
python3 -c "import json; c = json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size'] = 4096; json.dump(c, open('/tmp/cfg4096.json', 'w'))"
/tmp/b/deltaserve init-random --config /tmp/cfg4096.json -o $MODEL --dtype bf16 --tokenizer-from models/gdn-demo > /tmp/init.log 2>&1
timeout 60 /tmp/b/gpu_bench --model-only --graphs-only --no-prefill --model-dir $MODEL --batches 16,64 > $L/bare.md 2>&1
start_server /tmp/b/deltaserve 18701 /tmp/serve.log --model $MODEL --device cuda --dtype bf16 --max-num-seqs 256 --max-model-len 4096 --max-queue 4096
B=/tmp/b/serve_bench; U=http://127.0.0.1:18701
$B --url $U --num-prompts 16 --input-len 512 --output-len 32 --max-concurrency 16 --label warmup > /dev/null
for C in 64 16 64; do
  timeout 60 $B --url $U --num-prompts $((4 * C)) --input-len 512 --output-len 256 --max-concurrency $C --label "c$C" --json /tmp/c$C.json | tail -1 | tee -a $L/serve.md
done
kill $server_pid; wait $server_pid 2>/dev/null
grep -E "copy bandwidth|^\| [0-9]" $L/bare.md
tail -5 /tmp/serve.log > $L/serve_log_tail.txt

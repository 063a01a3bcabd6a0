#!/bin/bash
# Device call 5: served throughput on the H200 against the bare decode step, same checkpoint
# (1.39B shape, vocabulary 4,096), one call.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
source scripts/serve-common.sh
MODEL=/tmp/v4096
python3 -c "import json; c = json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size'] = 4096; json.dump(c, open('/tmp/cfg4096.json', 'w'))"
/tmp/b/deltaserve init-random --config /tmp/cfg4096.json -o $MODEL --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
timeout 120 /tmp/b/gpu_bench --model-only --graphs-only --no-prefill --model-dir $MODEL > $L/bare.md 2>&1
start_server /tmp/b/deltaserve 18701 $L/serve.log --model $MODEL --device cuda --dtype bf16 --max-num-seqs 256 --max-model-len 4096 --max-queue 4096
B=/tmp/b/serve_bench; U=http://127.0.0.1:18701
$B --url $U --num-prompts 16 --input-len 512 --output-len 32 --max-concurrency 16 --label warmup > /dev/null
for C in 16 64; do for run in 1 2; do
  timeout 120 $B --url $U --num-prompts $((4 * C)) --input-len 512 --output-len 256 --max-concurrency $C --label "c$C-$run" --json $L/c$C-$run.json | tail -1 | tee -a $L/serve.md
done; done
kill $server_pid; wait $server_pid 2>/dev/null
grep -E "copy bandwidth|^\| [0-9]" $L/bare.md
head -3 $L/c64-1.json | cut -c1-600
tar -C $L -czf $OUT/serve.tgz .

#!/bin/bash
# Call 7: the build at b381e85 (serve's mixed graphs follow the step budget): the GPU serving
# check at the default budget and at 1024, then 64 streams at budget 1024 with no
# --mixed-graph-tokens (now graphs to 1024) and at the default 512.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run7.sh $L/run.sh
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --max-num-batched-tokens 1024\n' > /tmp/b/b1024; chmod +x /tmp/b/b1024
LOGS=$L/check512 timeout 120 bash scripts/gpu-serve-check.sh /tmp/b/deltaserve > $L/check512.log 2>&1; echo "check 512 rc=$?"; tail -2 $L/check512.log
LOGS=$L/check1024 timeout 120 bash scripts/gpu-serve-check.sh /tmp/b/b1024 > $L/check1024.log 2>&1; echo "check 1024 rc=$?"; tail -2 $L/check1024.log
grep -h -o "mixed[^ ]*graph[^,]*" $L/check1024/serve-cuda.log | head -3
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $M/config.json ] || /tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
timeout 60 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 64 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s:%s ", $2, $4}')"
source scripts/serve-common.sh
port=18900
for t in 1024 512; do
  port=$((port + 1))
  start_server /tmp/b/deltaserve $port $L/serve-$t.log --model $M --device cuda --dtype bf16 --max-num-seqs 256 --max-model-len 4096 --max-queue 4096 --max-num-batched-tokens $t
  pid=$server_pid
  /tmp/b/serve_bench --url http://127.0.0.1:$port --num-prompts 16 --input-len 512 --output-len 32 --max-concurrency 16 --label warmup > /dev/null
  /tmp/b/serve_bench --url http://127.0.0.1:$port --num-prompts 256 --input-len 512 --output-len 256 --max-concurrency 64 \
    --label "budget$t" --json $L/budget$t.json | tail -2 | tee -a $L/c64.md
  kill $pid; wait $pid 2>/dev/null
done
grep -h "warm" $L/serve-1024.log | head -3 | cut -c1-300
rm -f $L/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Device call 3: the build before (`prev`: mixed graphs, 64 decode graphs kept) against this one
# (`this`: 512 decode graphs kept, mixed shapes of 1-4 pieces warmed) at concurrency 64 and on
# the chat mix (Poisson, 16 requests/s), alternating; the bare step; a traced run of this build.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run3.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
printf '#!/bin/sh\nDELTASERVE_LOG=deltaserve::scheduler=trace,info exec /tmp/b/deltaserve "$@"\n' > /tmp/b/traced; chmod +x /tmp/b/traced
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
/tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
echo init rc=$?
timeout 40 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 16,32,64 > $L/bare.log 2>&1
echo bare rc=$?; grep -E "^\| [0-9]" $L/bare.log
i=0
for b in prev this prev this; do
  i=$((i+1))
  MODEL=$M timeout 50 bash benches/serving_sweep.sh /tmp/b/deltaserve-$b /tmp/b/serve_bench $L/c64-$i-$b 64 > $L/c64-$i.log 2>&1
  echo "c64 $b rc=$? $(tail -1 $L/c64-$i-$b/table.md)"; grep -h "engine, from" $L/c64-$i.log | tail -1
done
source scripts/serve-common.sh
i=0
for b in prev this prev this; do
  i=$((i+1))
  start_server /tmp/b/deltaserve-$b 18900 $L/chat-$i-$b.log --model $M --device cuda --dtype bf16 --max-num-seqs 256 --max-model-len 4096 --max-queue 4096
  grep -h "warmed up" $L/chat-$i-$b.log | sed 's/\x1b\[[0-9;]*m//g' | grep -o "prefill_graph.*"
  timeout 40 /tmp/b/serve_bench --url http://127.0.0.1:18900 --dataset chat --num-prompts 80 --request-rate 16 --seed 1 \
    --label "chat-$b" --json $L/chat-$i-$b.json 2>>$L/chat-$i-$b.bench.log | tail -1
  kill $server_pid; wait $server_pid 2>/dev/null
done
MODEL=$M timeout 50 bash benches/serving_sweep.sh /tmp/b/traced /tmp/b/serve_bench $L/c64-traced 64 > $L/c64-traced.log 2>&1
echo "c64 traced rc=$? $(tail -1 $L/c64-traced/table.md)"
python3 benches/step_breakdown.py $L/c64-traced/serve-cuda.log > $L/step_breakdown.md; cat $L/step_breakdown.md
gzip -f $L/c64-traced/serve-cuda.log
rm -f $L/*/serving.svg
cd $OUT && tar czf logs.tgz logs && rm -rf logs

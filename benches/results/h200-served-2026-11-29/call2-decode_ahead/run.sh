#!/bin/bash
# Call 4: steps launched ahead of the emit (`--decode-ahead`, "ahead") against the default
# ("plain"), this build: served at concurrency 64 (two rounds of two runs, alternating), then the
# chat workload (8 conversations, 8 turns) with the prefix cache and without, two rounds.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz && xz -dc .devbuild/loadgen.xz > /tmp/b/loadgen && chmod +x /tmp/b/loadgen
L=$OUT/logs; mkdir -p $L; cp .devbuild/run4.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --decode-ahead\n' > /tmp/b/ahead; chmod +x /tmp/b/ahead
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
/tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
timeout 30 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 64 > $L/bare.log 2>&1
grep -E "^\| [0-9]" $L/bare.log
MODEL=$M timeout 200 bash benches/ab_serving.sh /tmp/b/deltaserve /tmp/b/ahead /tmp/b/serve_bench $L/ab > $L/ab.log 2>&1
echo "ab rc=$?"; cat $L/ab/ab.md; rm -f $L/ab/serve-*.log
MODEL=/tmp/chat-1.3b ROUNDS=2 CONVS="8" TURNS=8 timeout 280 bash benches/prefix_cache_chat.sh /tmp/b/loadgen $L/chat plain=/tmp/b/deltaserve ahead=/tmp/b/ahead > $L/chat.log 2>&1
echo "chat rc=$?"; grep -E "^## |turns 2" $L/chat/chat.md
rm -f $L/chat/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

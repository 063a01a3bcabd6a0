#!/bin/bash
# Call 6: the defaults as shipped (GPU step budget 1024, --long-prefill-chunk 512): long prompts
# under 32 streams, the defaults (n) against --long-prefill-chunk 128 (c128), alternating, two
# rounds; 64 streams of 512-token prompts at the defaults; the bare steps.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run6.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $M/config.json ] || /tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@"\n' > /tmp/b/n; chmod +x /tmp/b/n
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --long-prefill-chunk 128\n' > /tmp/b/c128; chmod +x /tmp/b/c128
timeout 200 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 32,64 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s:%s ", $2, $4}')"
MODEL=$M timeout 330 bash benches/long_prompts.sh /tmp/b/serve_bench $L/long n1=/tmp/b/n c128a=/tmp/b/c128 n2=/tmp/b/n c128b=/tmp/b/c128 > $L/long.log 2>&1
echo "long rc=$?"; grep "ITL after\|long-prompts |" $L/long/table.md
source scripts/serve-common.sh
start_server /tmp/b/n 18901 $L/serve-c64.log --model $M --device cuda --dtype bf16 --max-num-seqs 256 --max-model-len 4096 --max-queue 4096
pid=$server_pid
/tmp/b/serve_bench --url http://127.0.0.1:18901 --num-prompts 16 --input-len 512 --output-len 32 --max-concurrency 16 --label warmup > /dev/null
/tmp/b/serve_bench --url http://127.0.0.1:18901 --num-prompts 256 --input-len 512 --output-len 256 --max-concurrency 64 \
  --label "c64-n" --json $L/c64-n.json | tail -1 | tee -a $L/c64.md
kill $pid; wait $pid 2>/dev/null
rm -f $L/serve-*.log $L/long/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

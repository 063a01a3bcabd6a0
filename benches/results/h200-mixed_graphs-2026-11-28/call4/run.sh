#!/bin/bash
# Device call 4: the GPU suite on the final build; long prompts under 32 streams with 256- and
# 128-token pieces (mixed graphs on).
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run4.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --max-num-batched-tokens 256\n' > /tmp/b/b256
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --max-num-batched-tokens 128\n' > /tmp/b/b128
chmod +x /tmp/b/b256 /tmp/b/b128
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
/tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
echo init rc=$?
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 250 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; tail -1 $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -20
timeout 40 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 32 > $L/bare.log 2>&1
echo bare rc=$?; grep -E "^\| [0-9]" $L/bare.log
MODEL=$M timeout 150 bash benches/long_prompts.sh /tmp/b/serve_bench $L/long b256=/tmp/b/b256 b128=/tmp/b/b128 > $L/long.log 2>&1
echo long rc=$?; cat $L/long/table.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 2: the served 1.39B (vocabulary 4,096) on this build (decode steps ahead by default, the
# short conv folded into the input projection): the bare decode step, the serving sweep at
# concurrency 1, 16, 64, the conv folded against apart (DELTASERVE_CONV_FOLD=0) served at
# concurrency 1, alternating, and long prompts under 32 streams with the default step budget and
# with 256-token pieces.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/serve.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run2.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --max-num-batched-tokens 256\n' > /tmp/b/b256
printf '#!/bin/sh\nDELTASERVE_CONV_FOLD=0 exec /tmp/b/deltaserve "$@"\n' > /tmp/b/apart
chmod +x /tmp/b/b256 /tmp/b/apart
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
/tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
echo init rc=$?
timeout 60 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 1,16,32,64 > $L/bare.log 2>&1
echo bare rc=$?; grep -E "^\| [0-9]" $L/bare.log
MODEL=$M timeout 200 bash benches/serving_sweep.sh /tmp/b/deltaserve /tmp/b/serve_bench $L/sweep 1 16 64 > $L/sweep.log 2>&1
echo "sweep rc=$?"; cat $L/sweep/table.md
rm -f $L/sweep/serving.svg
MODEL=$M C=1 ROUNDS=3 timeout 120 bash benches/ab_serving.sh /tmp/b/apart /tmp/b/deltaserve /tmp/b/serve_bench $L/ab_c1 > $L/ab_c1.log 2>&1
echo "ab c1 rc=$?"; cat $L/ab_c1/table.md 2>/dev/null || tail -12 $L/ab_c1.log
MODEL=$M timeout 170 bash benches/long_prompts.sh /tmp/b/serve_bench $L/long default=/tmp/b/deltaserve b256=/tmp/b/b256 > $L/long.log 2>&1
echo long rc=$?; cat $L/long/table.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

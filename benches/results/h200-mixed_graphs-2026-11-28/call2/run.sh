#!/bin/bash
# Device call 2: the warm-up and mixed-graph GPU tests on the final build; long prompts under 32
# streams with 256-token pieces (graph / eager) and the defaults (graph), two rounds; a traced
# concurrency-64 run for the served step's breakdown.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run2.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --mixed-graph-tokens 0 --max-num-batched-tokens 256\n' > /tmp/b/e256
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --max-num-batched-tokens 256\n' > /tmp/b/g256
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@"\n' > /tmp/b/g512
printf '#!/bin/sh\nDELTASERVE_LOG=deltaserve::scheduler=trace,info exec /tmp/b/deltaserve "$@"\n' > /tmp/b/traced
chmod +x /tmp/b/e256 /tmp/b/g256 /tmp/b/g512 /tmp/b/traced
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
/tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
echo init rc=$?
DELTASERVE_TESTS_DIR=$PWD/tests timeout 120 /tmp/b/gpu_tests warm_up mixed_graphs prefill_graphs > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$?"; tail -1 $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -20
timeout 40 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 32,64 > $L/bare.log 2>&1
echo bare rc=$?; grep -E "^\| [0-9]" $L/bare.log
MODEL=$M timeout 230 bash benches/long_prompts.sh /tmp/b/serve_bench $L/long g256=/tmp/b/g256 e256=/tmp/b/e256 g512=/tmp/b/g512 g256b=/tmp/b/g256 e256b=/tmp/b/e256 > $L/long.log 2>&1
echo long rc=$?; cat $L/long/table.md
MODEL=$M timeout 45 bash benches/serving_sweep.sh /tmp/b/traced /tmp/b/serve_bench $L/c64-traced 64 > $L/c64.log 2>&1
echo "c64 traced rc=$?"; tail -1 $L/c64-traced/table.md
python3 benches/step_breakdown.py $L/c64-traced/serve-cuda.log $L/step_breakdown.md; cat $L/step_breakdown.md
gzip -f $L/c64-traced/serve-cuda.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

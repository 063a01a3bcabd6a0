#!/bin/bash
# Device call: mixed passes as CUDA graphs. GPU suite; gpu_bench --mixed-passes (two passes,
# eager mixed, graph mixed); long prompts under 32 streams and concurrency 64, with mixed graphs
# (`graph`) and without (`eager`, --mixed-graph-tokens 0), alternating.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run1.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --mixed-graph-tokens 0\n' > /tmp/b/eager; chmod +x /tmp/b/eager
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@"\n' > /tmp/b/graph; chmod +x /tmp/b/graph
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
/tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
echo init rc=$?
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 250 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; tail -1 $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -20
timeout 60 /tmp/b/gpu_bench --mixed-passes --model-dir $M --reps 5 > $L/mixed.log 2>&1
echo mixed rc=$?; grep -E "^\|" $L/mixed.log
timeout 40 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 32,64 > $L/bare.log 2>&1
echo bare rc=$?; grep -E "^\| [0-9]" $L/bare.log
MODEL=$M timeout 130 bash benches/long_prompts.sh /tmp/b/serve_bench $L/long graph=/tmp/b/graph eager=/tmp/b/eager > $L/long.log 2>&1
echo long rc=$?; cat $L/long/table.md
for b in graph eager graph eager; do
  MODEL=$M timeout 45 bash benches/serving_sweep.sh /tmp/b/$b /tmp/b/serve_bench $L/c64-$b-$RANDOM 64 >> $L/c64.log 2>&1
  echo "c64 $b rc=$?"; tail -1 $(ls -td $L/c64-$b-* | head -1)/table.md
done
grep -h "warmed up" $L/long/serve-graph.log | head -2
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 7: the final build (a677a9c) through the server: the GPU server against the CPU server
# (compact gdn and qwen3_5, loopback HTTP), then the served 1.39B (vocabulary 4,096) at 1, 16 and
# 64 streams against its bare step in the same call.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run7.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
for m in gdn qwen3_5; do LOGS=$L/serve-check-$m timeout 80 bash scripts/gpu-serve-check.sh /tmp/n/deltaserve tests/fixtures/compact/$m > $L/serve-check-$m.log 2>&1; echo "serve-check $m rc=$? $(tail -1 $L/serve-check-$m.log)"; done
V=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $V/config.json ] || /tmp/n/deltaserve init-random --config $L/config.json -o $V --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
timeout 90 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $V --batches 1,16,64 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s: %.4f ms %s tok/s ", $2, 1000*$2/$5, $5}')"
MODEL=$V timeout 230 bash benches/serving_sweep.sh /tmp/n/deltaserve /tmp/n/serve_bench $L/sweep 1 16 64 > $L/sweep.log 2>&1
echo "sweep rc=$?"; cat $L/sweep/table.md
rm -f $L/sweep/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

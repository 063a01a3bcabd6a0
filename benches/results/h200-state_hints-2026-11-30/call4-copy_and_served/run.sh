#!/bin/bash
# Call 4: the GPU's copy bandwidth with and without streaming cache hints (copy_probe.cu: is
# there a copy faster than the roofline's?), then this build served again at 16 and 64 streams
# (the 1.39B, vocabulary 4,096), twice, each against the bare step of this call.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run4.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
P=benches/results/h200-state_hints-2026-11-30/copy_probe.cu
nvcc -O3 -arch=sm_90a $P -o /tmp/copy_probe > $L/copy_probe_build.log 2>&1 && /tmp/copy_probe > $L/copy_probe.log 2>&1
cat $L/copy_probe.log
V=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $V/config.json ] || /tmp/n/deltaserve init-random --config $L/config.json -o $V --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
timeout 120 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $V --batches 1,16,64 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s: %s tok/s ", $2, $5}')"
grep "copy bandwidth" $L/bare.log
for r in 1 2; do
  MODEL=$V timeout 180 bash benches/serving_sweep.sh /tmp/n/deltaserve /tmp/n/serve_bench $L/sweep$r 16 64 > $L/sweep$r.log 2>&1
  echo "sweep $r rc=$?"; cat $L/sweep$r/table.md
  rm -f $L/sweep$r/serve-*.log
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

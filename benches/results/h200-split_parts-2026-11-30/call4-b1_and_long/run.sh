#!/bin/bash
# Call 4: where the batch-1 steps go with this build (Nsight Compute, the Qwen3.5 layout and
# the 1.39B); long prompts under 32 streams at the defaults and with --long-prefill-chunk 128,
# beside the bare batch-32 step.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run4.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
B=/tmp/n/gpu_bench
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $M/config.json ] || /tmp/n/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
NCU="ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw"
timeout 100 $NCU $B --hybrid-dir /tmp/q35 --reps 3 --profile-hybrid-decode 1 > $L/ncu-q35-b1.csv 2> $L/ncu-q35.err
echo "ncu q35 rc=$?"; python3 benches/ncu_kernels.py q35-b1 $L/ncu-q35-b1.csv > $L/kernels-q35-b1.md 2>&1; head -40 $L/kernels-q35-b1.md
timeout 100 $NCU $B --model-only --no-prefill --model-dir $M --reps 3 --profile-decode 1 > $L/ncu-gdn-b1.csv 2> $L/ncu-gdn.err
echo "ncu gdn rc=$?"; python3 benches/ncu_kernels.py gdn-b1 $L/ncu-gdn-b1.csv > $L/kernels-gdn-b1.md 2>&1; head -40 $L/kernels-gdn-b1.md
printf '#!/bin/sh\nexec /tmp/n/deltaserve "$@"\n' > /tmp/n/n; chmod +x /tmp/n/n
printf '#!/bin/sh\nexec /tmp/n/deltaserve "$@" --long-prefill-chunk 128\n' > /tmp/n/c128; chmod +x /tmp/n/c128
timeout 60 $B --model-only --no-prefill --graphs-only --model-dir $M --batches 32 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s:%s ", $2, $4}')"
MODEL=$M timeout 240 bash benches/long_prompts.sh /tmp/n/serve_bench $L/long n=/tmp/n/n c128=/tmp/n/c128 > $L/long.log 2>&1
echo "long rc=$?"; grep "ITL after\|long-prompts |" $L/long/table.md
rm -f $L/long/serve-*.log $L/*.csv
cd $OUT && tar czf logs.tgz logs && rm -rf logs

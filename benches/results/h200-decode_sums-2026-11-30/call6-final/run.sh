#!/bin/bash
# Call 7: the decode step: column sums by one thread a column, k·q in warp 0, the gates' loads
# first, one householder step compiled apart, the slot read before the wait: the GPU suite, then decode steps of this build (new) against HEAD's (base), alternating,
# two rounds, f32 states on both models and bf16 states on the 1.39B; then the served 1.39B
# (vocabulary 4,096) at 16 and 64 streams against its bare step.
mkdir -p /tmp/n /tmp/b && tar -C /tmp/n -xJf .devbuild/t.tar.xz && tar -C /tmp/b -xJf .devbuild/base.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run11.sh $L/run.sh; cp benches/decode_probe.cu $L/
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T=$(grep -o '("gpu_[a-z0-9_]*"' tests/gpu.rs | tr -d '("' | grep -v tensor_parallel)
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|test result" $L/gpu_tests.log | tail -8
s=$(date +%s)
ROUNDS=2 BATCHES=1,16,64 TIMEOUT=80 bash benches/ab_decode.sh $L/ab base=/tmp/b/gpu_bench new=/tmp/n/gpu_bench > $L/ab.out 2>&1
echo "ab rc=$? $(( $(date +%s) - s )) s"; cat $L/ab/summary.md
s=$(date +%s)
MODELS=gdn ROUNDS=2 BATCHES=1,16,64 TIMEOUT=80 bash benches/ab_decode.sh $L/ab_bf16 "base=/tmp/b/gpu_bench --state-dtype bf16" "new=/tmp/n/gpu_bench --state-dtype bf16" > $L/ab_bf16.out 2>&1
echo "ab bf16 rc=$? $(( $(date +%s) - s )) s"; cat $L/ab_bf16/summary.md
V=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $V/config.json ] || /tmp/n/deltaserve init-random --config $L/config.json -o $V --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
timeout 90 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $V --batches 1,16,64 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s: %.4f ms %s tok/s ", $2, 1000*$2/$5, $5}')"
MODEL=$V timeout 200 bash benches/serving_sweep.sh /tmp/n/deltaserve /tmp/n/serve_bench $L/sweep 16 64 > $L/sweep.log 2>&1
echo "sweep rc=$?"; cat $L/sweep/table.md
rm -f $L/sweep/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

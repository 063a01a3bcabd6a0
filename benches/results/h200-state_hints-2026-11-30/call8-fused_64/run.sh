#!/bin/bash
# Call 8: the fused step up to 64 rows (this build's default) against 16 (the setting before),
# one binary, the 1.39B, alternating, two rounds; the served 1.39B (vocabulary 4,096) at 64
# streams beside its bare step; the fused-step and graph GPU tests.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run8.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
B=/tmp/n/gpu_bench
MODELS=gdn ROUNDS=2 TIMEOUT=90 bash benches/ab_decode.sh $L/ab "f16=DELTASERVE_FUSED_STEP_MAX_BATCH=16 $B" f64=$B > $L/ab.out 2>&1
cat $L/ab/summary.md
V=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $V/config.json ] || /tmp/n/deltaserve init-random --config $L/config.json -o $V --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
timeout 60 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $V --batches 64 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s: %s tok/s ", $2, $5}')"
MODEL=$V timeout 100 bash benches/serving_sweep.sh /tmp/n/deltaserve /tmp/n/serve_bench $L/sweep 64 > $L/sweep.log 2>&1
echo "sweep rc=$?"; cat $L/sweep/table.md; rm -f $L/sweep/serve-*.log
DELTASERVE_TESTS_DIR=$PWD/tests timeout 60 /tmp/n/gpu_tests gpu_raw_decode_step_equals_prepare_then_step gpu_decode_graphs_equal_eager_decode gpu_models_match_cpu_and_goldens gpu_batch_invariant_mode_logits_do_not_depend_on_the_batch > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "GPU tests|FAIL|panicked" $L/tests.log | tail -3
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 5: the add + norm launcher shared by both forms (the tests that run it); long prompts under
# 32 streams with the measured cap (the new default, auto), 128 and 512 (the default before),
# beside the bare batch-32 step; the cap each server last set.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run5.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T="gpu_split_projection_slices_sum_to_the_product gpu_split_projections_leave_a_models_logits gpu_ops_match_reference gpu_norm_folded_into_gemv_equals_two_kernels gpu_decode_graphs_equal_eager_decode gpu_models_match_cpu_and_goldens gpu_mixed_graphs_equal_eager_mixed_passes"
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests $T > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "GPU tests|FAIL|panicked|against f32" $L/tests.log | tail -5
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $M/config.json ] || /tmp/n/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
for c in 128 512; do printf '#!/bin/sh\nexec /tmp/n/deltaserve "$@" --long-prefill-chunk %s\n' $c > /tmp/n/c$c; chmod +x /tmp/n/c$c; done
timeout 60 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 32 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s:%s ", $2, $4}')"
MODEL=$M timeout 330 bash benches/long_prompts.sh /tmp/n/serve_bench $L/long auto=/tmp/n/deltaserve c128=/tmp/n/c128 c512=/tmp/n/c512 > $L/long.log 2>&1
echo "long rc=$?"; grep "ITL after\|long-prompts |" $L/long/table.md; cat $L/long/*-cap.txt
rm -f $L/long/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 4: bf16 states held as their bits in registers (twice the columns a lane). The bf16-state
# tests and those the step kernels touch; decode steps f32 / bf16 states (and bf16 at four columns
# on the Qwen3.5 layout), alternating, two rounds; the served 1.39B (vocabulary 4,096) at 64
# streams with each, beside the bare steps; Nsight Compute on the 1.39B's batch-64 step kernel.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run4.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T="gpu_bf16_states_follow_the_goldens gpu_prefix_cache_snapshots_match_whole_prefills gpu_decode_graphs_equal_eager_decode gpu_packed_model_prefill_equals_each_alone gpu_chunk_boundaries_match_cpu gpu_models_match_cpu_and_goldens gpu_raw_decode_step_equals_prepare_then_step gpu_decode_in_any_slot_order_equals_each_alone gpu_host_tier_round_trips_snapshots_exactly gpu_mixed_graphs_equal_eager_mixed_passes"
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests $T > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "GPU tests|FAILED|panicked|bf16 against f32 states" $L/tests.log | tail -30
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
B=/tmp/n/gpu_bench
ROUNDS=2 BATCHES=1,16,64 TIMEOUT=90 bash benches/ab_decode.sh $L/ab f32=$B "bf16=$B --state-dtype bf16" "bf16c4=DELTASERVE_DECODE_KERNEL=w16_r8_c4_b2 $B --state-dtype bf16" > $L/ab.out 2>&1
cat $L/ab/summary.md
timeout 120 ncu --profile-from-start off --kernel-name regex:gdr_decode --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv $B --model-only --no-prefill --graphs-only --reps 3 --profile-decode 64 --state-dtype bf16 > $L/ncu-bf16.csv 2> $L/ncu-bf16.err
grep -c gdr_decode $L/ncu-bf16.csv; grep gpu__time_duration $L/ncu-bf16.csv | head -2
V=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $V/config.json ] || /tmp/n/deltaserve init-random --config $L/config.json -o $V --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
for sd in f32 bf16; do
  timeout 60 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $V --batches 64 --state-dtype $sd > $L/bare-$sd.log 2>&1
  echo "bare $sd: $(grep -E '^\| [0-9]+ \| yes' $L/bare-$sd.log | awk -F'|' '{printf "%s: %s ms %s tok/s %s", $2, $4, $5, $7}')"
  printf '#!/bin/sh\nexec /tmp/n/deltaserve "$@" --state-dtype %s\n' $sd > /tmp/n/serve-$sd; chmod +x /tmp/n/serve-$sd
  MODEL=$V timeout 100 bash benches/serving_sweep.sh /tmp/n/serve-$sd /tmp/n/serve_bench $L/sweep-$sd 64 > $L/sweep-$sd.log 2>&1
  echo "served $sd rc=$?"; tail -1 $L/sweep-$sd/table.md; rm -f $L/sweep-$sd/serve-*.log
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 3: bf16 states with each row's bits loaded before any is unpacked. The bf16-state tests;
# decode steps f32 / bf16 states (and bf16 at the 1.39B's four-column shape), alternating, two
# rounds; Nsight Compute on the 1.39B's batch-64 step kernel with each.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run3.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T="gpu_bf16_states_follow_the_goldens gpu_prefix_cache_snapshots_match_whole_prefills gpu_decode_graphs_equal_eager_decode gpu_packed_model_prefill_equals_each_alone gpu_chunk_boundaries_match_cpu"
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "GPU tests|FAILED|panicked|worst|greedy tokens" $L/tests.log | grep -v "F32 (states F32)\|F32$" | tail -40
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
B=/tmp/n/gpu_bench
ROUNDS=2 BATCHES=1,16,64 TIMEOUT=90 bash benches/ab_decode.sh $L/ab f32=$B "bf16=$B --state-dtype bf16" "bf16c4=DELTASERVE_DECODE_KERNEL=w32_r8_c4_b1 $B --state-dtype bf16" > $L/ab.out 2>&1
cat $L/ab/summary.md
for sd in f32 bf16; do
  timeout 120 ncu --profile-from-start off --kernel-name regex:gdr_decode --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread --csv $B --model-only --no-prefill --graphs-only --reps 3 --profile-decode 64 --state-dtype $sd > $L/ncu-$sd.csv 2> $L/ncu-$sd.err
  python3 - $L/ncu-$sd.csv $sd <<'PY'
import csv,sys,collections
rows=[r for r in csv.reader(open(sys.argv[1])) if len(r)>10]
h=rows[0]; data=rows[2:] if len(rows)>2 else []
ix={k:i for i,k in enumerate(h)}
agg=collections.defaultdict(list)
for r in data:
    agg[(r[ix['Kernel Name']],r[ix['Metric Name']])].append(r[ix['Metric Value']])
for (k,m),v in sorted(agg.items()):
    vals=[float(x.replace(',','')) for x in v]
    print(sys.argv[2], k[:50], m, len(vals), sum(vals)/len(vals))
PY
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

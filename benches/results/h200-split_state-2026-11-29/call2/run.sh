#!/bin/bash
# Device call 2: the split (near-fp32) state pass on mma.sync: GPU suite; mixer tables of main
# and this build alternating; the 1.39B's prefill T=4096 (main, this) and transformers + fla;
# ncu times of the f32 launches at 1x4096.
mkdir -p /tmp/m /tmp/b && tar -C /tmp/m -xJf .devbuild/main.tar.xz && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run2.sh $L/run.sh
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; tail -2 $L/gpu_tests.log; grep -E "panicked|FAILED|failed" -A3 $L/gpu_tests.log | head -30
grep -E "GPU vs CPU" $L/gpu_tests.log | grep F32 | sort -t: -k2 | tail -4
for b in m b m b; do
  timeout 100 /tmp/$b/gpu_bench --skip-model > $L/mixers-$b.md 2>&1
  echo "mixers $b rc=$?"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/mixers-$b.md
done
for b in m b; do
  timeout 100 /tmp/$b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-$b.md 2>&1
  echo "model $b rc=$?"; grep -i "^prefill" $L/model-$b.md
done
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl 2>/dev/null
PYTHONPATH=$FLA timeout 120 python3 benches/fla_prefill.py /tmp/deltaserve-gdn-1.3b $L/fla_prefill.json 4096 20 > $L/fla_prefill.log 2>&1
echo "fla_prefill rc=$?"; tail -1 $L/fla_prefill.log
timeout 100 /tmp/b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-b2.md 2>&1
echo "model b2 rc=$?"; grep -i "^prefill" $L/model-b2.md
timeout 120 ncu --clock-control none -k regex:"chunk_(split|tc_prep_f32|mma|tc_prep_bf16)" --launch-count 12 --metrics gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread --csv --page raw /tmp/b/gpu_bench --skip-model --reps 1 > $L/ncu.csv 2>$L/ncu.err
echo "ncu rc=$?"
python3 - $L/ncu.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
hdr = rows[0]; i = {h: n for n, h in enumerate(hdr)}
for r in rows[2:]:
    try: print(r[i["Kernel Name"]][:40], r[i["launch__grid_size"]], r[i["launch__registers_per_thread"]], r[i["gpu__time_duration.sum"]])
    except Exception as e: pass
PY
cd $OUT && tar czf logs.tgz logs && rm -rf logs

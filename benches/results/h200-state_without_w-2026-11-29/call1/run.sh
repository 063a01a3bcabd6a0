#!/bin/bash
# Session 2026-11-29b, call 1: where the bf16 and f32 mixers' time goes (ncu, our two launches at
# every mixer shape), fla's kernels at the same shapes (torch.profiler), and the 1.39B's bf16
# prefill by kernel (benches/prefill_profile.sh).
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run5.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl 2>/dev/null
PYTHONPATH=$FLA timeout 240 python3 .devbuild/fla_kernels.py $L/fla_kernels.json > $L/fla_kernels.log 2>&1; echo "fla_kernels rc=$?"; tail -40 $L/fla_kernels.log
s=$(date +%s)
timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum,launch__grid_size,launch__occupancy_limit_shared_mem,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active -k regex:"chunk_" --launch-count 48 --csv --log-file $L/ncu-mixer.csv /tmp/b/gpu_bench --skip-model --reps 1 > $L/mixer-ncu-run.md 2>$L/ncu-mixer.err
echo "ncu mixer rc=$? $(( $(date +%s) - s )) s"
grep -E "gpu__time" $L/ncu-mixer.csv | awk -F'","' '{print $5, $9, $NF}' | head -48
s=$(date +%s)
timeout 200 bash benches/prefill_profile.sh /tmp/b/gpu_bench $L/prefill > $L/prefill_profile.log 2>&1
echo "prefill_profile rc=$? $(( $(date +%s) - s )) s"; head -40 $L/prefill/kernels-prefill.md; grep -i "^prefill" $L/prefill/model.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

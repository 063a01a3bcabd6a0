#!/bin/bash
# Device call 3: the 1.39B's prefill T=4096 (main; this build with its default and with 32-column
# value tiles) and transformers + fla in one call; ncu times of the f32 mixer's two launches; the
# Qwen3.5 layout against transformers (benches/hybrid_vs_hf.py).
mkdir -p /tmp/m /tmp/b && tar -C /tmp/m -xJf .devbuild/main.tar.xz && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run3.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl 2>/dev/null
timeout 60 /tmp/b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-b0.md 2>&1   # writes the checkpoint
s=$(date +%s)
PYTHONPATH=$FLA timeout 220 python3 benches/fla_prefill.py /tmp/deltaserve-gdn-1.3b $L/fla_prefill.json 4096 20 > $L/fla_prefill.log 2>&1
echo "fla_prefill rc=$? $(( $(date +%s) - s )) s"; tail -1 $L/fla_prefill.log
for b in m b m b; do
  timeout 60 /tmp/$b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-$b.md 2>&1
  echo "model $b rc=$?"; grep -i "^prefill" $L/model-$b.md
done
DELTASERVE_TC_BV=32 timeout 60 /tmp/b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-b-bv32.md 2>&1
echo "model b bv32 rc=$?"; grep -i "^prefill" $L/model-b-bv32.md
timeout 90 ncu --clock-control none --metrics gpu__time_duration.sum,launch__grid_size -k regex:"chunk_" --launch-count 8 --csv --log-file $L/ncu-model.csv /tmp/b/gpu_bench --model-only --batches 1 --graphs-only > /dev/null 2>$L/ncu-model.err
echo "ncu model rc=$?"; grep -E "chunk_" $L/ncu-model.csv | awk -F'","' '{print $5, $(NF-2), $NF}' | head -20
timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum,launch__grid_size -k regex:"chunk_(split|tc_prep_f32)" --launch-count 4 --csv --log-file $L/ncu-mixer.csv /tmp/b/gpu_bench --skip-model --reps 1 > /dev/null 2>$L/ncu-mixer.err
echo "ncu mixer rc=$?"; grep -E "chunk_" $L/ncu-mixer.csv | awk -F'","' '{print $5, $(NF-2), $NF}' | head -20
s=$(date +%s)
PYTHONPATH=$FLA timeout 250 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/b/gpu_bench --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1
echo "hybrid rc=$? $(( $(date +%s) - s )) s"; tail -7 $L/hybrid_vs_hf.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

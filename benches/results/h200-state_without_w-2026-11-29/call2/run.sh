#!/bin/bash
# Call 2: bf16 state pass without W (V' = T2 (V − e^G ⊙ K S)), f32 prep at two CTAs an SM.
# GPU suite; mixer tables main/this; ncu of this build's mixer launches; the 1.39B prefill
# alternating; fla's mixer in the same run.
mkdir -p /tmp/m /tmp/b && tar -C /tmp/m -xJf .devbuild/main.tar.xz && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run6.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep "test result" $L/gpu_tests.log; grep -E "panicked|FAILED|max abs|worst" $L/gpu_tests.log | head -30
for b in m b; do
  timeout 90 /tmp/$b/gpu_bench --skip-model > $L/mixers-$b.md 2>&1
  echo "mixers $b rc=$?"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/mixers-$b.md
done
timeout 90 ncu --clock-control none --metrics gpu__time_duration.sum -k regex:"chunk_" --launch-count 48 --csv --log-file $L/ncu-mixer.csv /tmp/b/gpu_bench --skip-model --reps 1 > /dev/null 2>$L/ncu-mixer.err
echo "ncu rc=$?"; grep -E "gpu__time" $L/ncu-mixer.csv | awk -F'","' '{print $5, $9, $NF}' | sort | uniq -c -w 40 | head -20
timeout 60 /tmp/b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-b0.md 2>&1   # writes the checkpoint
for b in m b m b; do
  timeout 60 /tmp/$b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-$b.md 2>&1
  echo "model $b rc=$?"; grep -i "^prefill" $L/model-$b.md
done
s=$(date +%s)
timeout 200 bash benches/mixer_vs_fla.sh /tmp/b/gpu_bench $L/fla > $L/mixer_vs_fla.log 2>&1
echo "mixer_vs_fla rc=$? $(( $(date +%s) - s )) s"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/fla/gpu_bench_mixers.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 3, the final build (double-buffered second group for one-CTA-an-SM grids, cp.async-only
# tile loader, k-steps unrolled there): GPU suite; fla's mixer in the same run; mixer tables of
# main and this build alternating; the 1.39B's prefill (main and this build alternating) beside
# transformers + fla.
mkdir -p /tmp/m /tmp/b && tar -C /tmp/m -xJf .devbuild/main.tar.xz && tar -C /tmp/b -xJf .devbuild/bins.tar.xz && tar -C /tmp/b -xJf .devbuild/tests.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run3.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep "test result" $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -30
grep -E "bf16 q/k/v" $L/gpu_tests.log
DELTASERVE_TC_DB=0 DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/b/gpu_tests chunk packed > $L/gpu_tests-db0.log 2>&1
echo "gpu_tests db0 rc=$?"; grep "test result" $L/gpu_tests-db0.log
s=$(date +%s)
timeout 240 bash benches/mixer_vs_fla.sh /tmp/b/gpu_bench $L/fla > $L/mixer_vs_fla.log 2>&1
echo "mixer_vs_fla rc=$? $(( $(date +%s) - s )) s"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/fla/gpu_bench_mixers.md
for r in 1 2; do
  timeout 60 /tmp/m/gpu_bench --skip-model > $L/mixers-m-$r.md 2>&1; echo "mixers m rc=$?"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/mixers-m-$r.md | head -4
  timeout 60 /tmp/b/gpu_bench --prefill-mixer-only > $L/mixers-b-$r.md 2>&1; echo "mixers b rc=$?"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/mixers-b-$r.md
done
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl 2>/dev/null
timeout 60 /tmp/b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-b0.md 2>&1   # writes the checkpoint
s=$(date +%s)
PYTHONPATH=$FLA timeout 150 python3 benches/fla_prefill.py /tmp/deltaserve-gdn-1.3b $L/fla_prefill.json 4096 20 > $L/fla_prefill.log 2>&1
echo "fla_prefill rc=$? $(( $(date +%s) - s )) s"; tail -1 $L/fla_prefill.log
for b in m b m b; do
  timeout 60 /tmp/$b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-$b.md 2>&1
  echo "model $b rc=$?"; grep -i "^prefill" $L/model-$b.md
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

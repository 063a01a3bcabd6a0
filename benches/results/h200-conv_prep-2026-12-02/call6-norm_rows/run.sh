#!/usr/bin/env bash
# The gated output norm at several rows a warp (b142) against one row a warp (b141): the GPU
# suite on b142; the norm's kernel times at T=4096 bf16 prefills under Nsight Compute; T=4096
# prefills and decode steps at batch 1 and 16, alternating, two rounds, both models.
L=$OUT/logs; mkdir -p $L /tmp/o /tmp/n
tar -C /tmp/o -xJf .devbuild/b141.tar.xz; tar -C /tmp/n -xJf .devbuild/b142.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:" $L/gpu_tests.log | head -20
python3 -c "import sys; sys.path.insert(0, 'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
timeout 120 /tmp/n/gpu_bench --model-only --model-dir /tmp/gdn --batches 1 > $L/gdn_model.md 2>&1
echo "built at ${SECONDS}s"
for m in q35 gdn; do
  A="--hybrid-dir /tmp/q35 --batches 1 --reps 1 --profile-hybrid-prefill"; [ $m = gdn ] && A="--profile-prefill --model-dir /tmp/gdn"
  for b in o n; do
    timeout 90 ncu --profile-from-start off --clock-control none --cache-control none --kernel-name regex:"gated_rms" --launch-count 12 \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread --csv --page raw \
      /tmp/$b/gpu_bench $A > $L/ncu_${m}_$b.csv 2> $L/ncu_${m}_$b.err
    python3 benches/ncu_median.py $L/ncu_${m}_$b.csv ${m}_$b
  done
done | tee $L/summary.txt
PREFILL=1 MODELS="q35 gdn" ROUNDS=2 BATCHES=1,16 TIMEOUT=90 timeout 300 bash benches/ab_decode.sh $L/ab \
  "base=/tmp/o/gpu_bench" "new=/tmp/n/gpu_bench" > $L/ab.log 2>&1; echo "ab rc $? at ${SECONDS}s"
cat $L/ab/summary.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# The sigmoid's exp2 and reciprocal in their flush-to-zero forms (b139) against b138 (__expf and
# __fdividef without -ftz), both with the fused conv + prep: the GPU suite on b139, then kernel
# times at T=4096 bf16 prefills under Nsight Compute, the conv and prep apart
# (DELTASERVE_CONV_PREP=0) and fused, the Qwen3.5 layout and the 1.39B.
L=$OUT/logs; mkdir -p $L /tmp/o /tmp/n
tar -C /tmp/o -xJf .devbuild/b138.tar.xz; tar -C /tmp/n -xJf .devbuild/b139.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 230 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:" $L/gpu_tests.log | head -20; grep -a "conv + prep" $L/gpu_tests.log | tail -3
python3 -c "import sys; sys.path.insert(0, 'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
timeout 120 /tmp/n/gpu_bench --model-only --model-dir /tmp/gdn --batches 1 > $L/gdn_model.md 2>&1
echo "built at ${SECONDS}s"
prof() { # name bin env model-args
  timeout 90 env $3 ncu --profile-from-start off --clock-control none --cache-control none \
    --kernel-name regex:"conv_prep|conv_prefill|prep_bf16|swiglu|gated_rms" --launch-count 20 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread --csv --page raw \
    $2 $4 > $L/ncu_$1.csv 2> $L/ncu_$1.err
  python3 benches/ncu_median.py $L/ncu_$1.csv $1
}
Q="--hybrid-dir /tmp/q35 --batches 1 --reps 1 --profile-hybrid-prefill"
G="--profile-prefill --model-dir /tmp/gdn"
for m in q35 gdn; do
  A=$Q; [ $m = gdn ] && A=$G
  prof ${m}_b138_apart /tmp/o/gpu_bench DELTASERVE_CONV_PREP=0 "$A"
  prof ${m}_b139_apart /tmp/n/gpu_bench DELTASERVE_CONV_PREP=0 "$A"
  prof ${m}_b138_fused /tmp/o/gpu_bench DELTASERVE_CONV_PREP_ROWS=$([ $m = q35 ] && echo 8 || echo 4) "$A"
  prof ${m}_b139_fused /tmp/n/gpu_bench X=1 "$A"
done
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# The prefill's conv and q/k prep in one launch: the GPU suite (gpu_conv_prep_equals_conv_then_prep
# new), and the kernels' times at the Qwen3.5 layout's and the 1.39B's T=4096 bf16 prefill under
# Nsight Compute, fused (default) and apart (DELTASERVE_CONV_PREP=0).
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/b136.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 230 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:" $L/gpu_tests.log | head -20; grep -a "conv + prep" $L/gpu_tests.log | head -12
python3 -c "import sys; sys.path.insert(0, 'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
echo "built at ${SECONDS}s"
for v in on off; do
  E=""; [ $v = off ] && E="DELTASERVE_CONV_PREP=0"
  timeout 120 env $E ncu --profile-from-start off --kernel-name regex:"conv_prep|conv_prefill|prep_bf16|conv_state" --launch-count 12 \
    /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --batches 1 --reps 1 --profile-hybrid-prefill > $L/ncu_q35_$v.txt 2> $L/ncu_q35_$v.err
  echo "ncu q35 $v rc $? at ${SECONDS}s"
  grep -E "^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Registers Per|Achieved Occupancy" $L/ncu_q35_$v.txt | head -48
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

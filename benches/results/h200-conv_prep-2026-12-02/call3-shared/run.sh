#!/usr/bin/env bash
# The fused conv + prep staging its rows in shared memory: the GPU suite, then kernel times at
# T=4096 bf16 prefills under Nsight Compute (clocks and caches as they are), rows a warp and
# register caps (DELTASERVE_CONV_PREP_ROWS / _BLOCKS) against the two launches apart
# (DELTASERVE_CONV_PREP=0), the Qwen3.5 layout (K = 128) and the 1.39B (K = 256).
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/b138.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 230 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:" $L/gpu_tests.log | head -20; grep -a "conv + prep" $L/gpu_tests.log | head -3
python3 -c "import sys; sys.path.insert(0, 'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
timeout 120 /tmp/n/gpu_bench --model-only --model-dir /tmp/gdn --batches 1 > $L/gdn_model.md 2>&1
echo "built at ${SECONDS}s"
prof() { # name env model-args
  timeout 90 env $2 ncu --profile-from-start off --clock-control none --cache-control none \
    --kernel-name regex:"conv_prep|conv_prefill|prep_bf16" --launch-count 9 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread --csv --page raw \
    /tmp/n/gpu_bench $3 > $L/ncu_$1.csv 2> $L/ncu_$1.err
  python3 benches/ncu_median.py $L/ncu_$1.csv $1
}
Q="--hybrid-dir /tmp/q35 --batches 1 --reps 1 --profile-hybrid-prefill"
G="--profile-prefill --model-dir /tmp/gdn"
prof q35_off DELTASERVE_CONV_PREP=0 "$Q"
for r in 8 16 32; do prof q35_r$r DELTASERVE_CONV_PREP_ROWS=$r "$Q"; done
prof q35_r16_b8 DELTASERVE_CONV_PREP_BLOCKS=8 "$Q"
prof gdn_off DELTASERVE_CONV_PREP=0 "$G"
for r in 4 8 16; do prof gdn_r$r DELTASERVE_CONV_PREP_ROWS=$r "$G"; done
prof gdn_r8_b5 DELTASERVE_CONV_PREP_BLOCKS=5 "$G"
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

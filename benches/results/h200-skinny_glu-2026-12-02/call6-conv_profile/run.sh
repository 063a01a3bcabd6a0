#!/usr/bin/env bash
# Why the prefill conv runs at ~1.4 TB/s: one launch of conv_prefill at the Qwen3.5 layout's
# T=4096 bf16 prefill under Nsight Compute's full sections (the default path of the final build).
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/b133.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
python3 -c "import sys; sys.path.insert(0, 'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
echo "built at ${SECONDS}s"
timeout 400 ncu --profile-from-start off --kernel-name regex:conv_prefill --launch-skip 2 --launch-count 1 --set full \
  /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --batches 1 --reps 1 --profile-hybrid-prefill > $L/ncu_conv.txt 2> $L/ncu_conv.err
echo "ncu rc $? at ${SECONDS}s"
grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Issue Slots|Stall|Warp Cycles|Compute \(SM\)" $L/ncu_conv.txt | head -40
tail -5 $L/ncu_conv.err
cd $OUT && tar czf logs.tgz logs && rm -rf logs

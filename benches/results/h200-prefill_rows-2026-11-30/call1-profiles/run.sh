#!/bin/bash
# Prefill profiles, call 1: where a T=4096 bf16-mixer prefill's kernel time goes on the H200,
# the Qwen3.5 layout and the 1.39B, Nsight Compute, kernels serialised.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/p1.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run18.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
python3 -c "import sys; sys.path.insert(0, 'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - s )) s"
s=$(date +%s)
timeout 200 bash benches/hybrid_profile.sh --prefill /tmp/n/gpu_bench /tmp/q35 $L/q35 > $L/q35.out 2>&1
echo "q35 rc=$? $(( $(date +%s) - s )) s"; head -30 $L/q35/kernels-prefill.md
s=$(date +%s)
timeout 200 bash benches/prefill_profile.sh /tmp/n/gpu_bench $L/gdn > $L/gdn.out 2>&1
echo "gdn rc=$? $(( $(date +%s) - s )) s"; head -30 $L/gdn/kernels-prefill.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

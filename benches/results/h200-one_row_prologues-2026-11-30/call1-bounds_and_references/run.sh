#!/bin/bash
# Call 1 (2026-11-30, second session): the chain bound (benches/chain_probe.cu), then HEAD's
# decode steps against the roofline, fla's mixer and transformers + fla's prefill in the same
# run, and the Qwen3.5 layout against transformers + fla.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run1.sh $L/run.sh; cp benches/chain_probe.cu $L/
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
nvcc -O3 -arch=sm_90a benches/chain_probe.cu -o /tmp/chain_probe > $L/chain_build.log 2>&1 && timeout 120 /tmp/chain_probe > $L/chain.md 2>&1
echo "chain rc=$? $(( $(date +%s) - s )) s"; cat $L/chain.md
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl > $L/pip.log 2>&1; echo "pip rc=$?"
s=$(date +%s)
PYTHONPATH=$FLA timeout 240 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1
echo "hybrid rc=$? $(( $(date +%s) - s )) s"; tail -8 $L/hybrid_vs_hf.log
s=$(date +%s)
ROUNDS=2 BATCHES=1,16,64 MODELS=gdn TIMEOUT=80 bash benches/ab_decode.sh $L/ab head=/tmp/n/gpu_bench > $L/ab.out 2>&1
echo "ab rc=$? $(( $(date +%s) - s )) s"; cat $L/ab/summary.md
s=$(date +%s)
timeout 130 bash benches/mixer_vs_fla.sh /tmp/n/gpu_bench $L/fla > $L/mixer_vs_fla.log 2>&1
echo "mixer_vs_fla rc=$? $(( $(date +%s) - s )) s"; grep -E "^\| [0-9]+ \| [0-9]+ \| 16" $L/fla/gpu_bench_mixers.md
s=$(date +%s)
PYTHONPATH=$FLA timeout 120 python3 benches/fla_prefill.py /tmp/deltaserve-gdn-1.3b $L/fla_prefill.json 4096 10 > $L/fla_prefill.log 2>&1
echo "fla_prefill rc=$? $(( $(date +%s) - s )) s"; tail -1 $L/fla_prefill.log
timeout 60 /tmp/n/gpu_bench --model-only --batches 1 --graphs-only > $L/model-prefill.md 2>&1; echo "model rc=$?"; grep -i "^prefill\|T=4096" $L/model-prefill.md | head
cd $OUT && tar czf logs.tgz logs && rm -rf logs

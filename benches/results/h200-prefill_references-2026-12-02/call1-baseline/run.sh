#!/usr/bin/env bash
# Baseline of the session (b141 = HEAD's kernels): the Qwen3.5 layout against transformers 5.17 +
# fla 0.6.0 (hybrid_vs_hf.py, 20 timed prefills a side); its T=4096 prefill and the 1.39B's
# profiled by kernel (Nsight Compute); the mixer against fla in the same run.
L=$OUT/logs; mkdir -p $L /tmp/n; cp .devbuild/run143.sh $L/run.sh
tar -C /tmp/n -xJf .devbuild/b141.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl > $L/pip.log 2>&1
PYTHONPATH=$FLA timeout 300 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1
echo "hf rc $? at ${SECONDS}s"; tail -8 $L/hybrid_vs_hf.log
timeout 150 bash benches/hybrid_profile.sh --prefill /tmp/n/gpu_bench /tmp/q35 $L/q35prof > $L/q35prof.out 2>&1
echo "q35 prof rc $? at ${SECONDS}s"; head -40 $L/q35prof/kernels-prefill.md
timeout 120 bash benches/mixer_vs_fla.sh /tmp/n/gpu_bench $L/mixer > $L/mixer.out 2>&1
echo "mixer rc $? at ${SECONDS}s"; grep -i "fla\||" $L/mixer/gpu_bench_mixers.md | head -30
cd $OUT && tar czf logs.tgz logs && rm -rf logs

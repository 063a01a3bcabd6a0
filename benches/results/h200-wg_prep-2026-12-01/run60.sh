#!/usr/bin/env bash
# Warpgroup prep: GPU suite, probe, mixer against fla with the prep on / off alternating, the
# Qwen3.5 layout against transformers and its prefill with the prep off, in one call.
L=$OUT/logs; mkdir -p $L/mixer /tmp/n
tar -C /tmp/n -xJf .devbuild/k21.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
nvcc -O3 -lineinfo -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda benches/prep_probe.cu -o /tmp/pp > $L/build_probe.log 2>&1 &
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1; echo "gpu tests rc $?"
grep -E "GPU tests:|FAILED|panicked" $L/gpu_tests.log | head; grep -E "warpgroup prep|paired prep" $L/gpu_tests.log
wait
timeout 100 /tmp/pp 30 > $L/probe.md 2>&1; echo "probe rc $?"; grep -E 'tf32|ms|MISMATCH|ALL' $L/probe.md
FLA=$(mktemp -d); pip install --quiet --no-deps --no-index --target "$FLA" .whl/*.whl 2>/dev/null
PYTHONPATH=$FLA timeout 100 python3 benches/fla_mixer.py $L/mixer/fla_mixer.json 2>$L/mixer/fla_mixer.log; echo "fla rc $?"
for r in 1 2; do
  timeout 60 /tmp/n/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/on_$r.md 2>&1; echo "on $r rc $?"
  DELTASERVE_TC_WG_PREP=0 timeout 60 /tmp/n/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/off_$r.md 2>&1; echo "off $r rc $?"
done
for f in $L/mixer/on_1.md $L/mixer/off_1.md $L/mixer/on_2.md $L/mixer/off_2.md; do echo $f; grep '^| [0-9]' $f; done
PYTHONPATH=$FLA timeout 280 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1; echo "hybrid rc $?"
grep -iE 'prefill|speed|x ' $L/hybrid_vs_hf.log | tail -12
for r in 1 2; do
  DELTASERVE_TC_WG_PREP=0 timeout 90 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --batches 1 --reps 5 > $L/hybrid_prep_off_$r.md 2>&1
  timeout 90 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --batches 1 --reps 5 > $L/hybrid_prep_on_$r.md 2>&1
done
grep -iE 'prefill' $L/hybrid_prep_o*.md | head -12
cd $OUT && tar czf logs.tgz logs && rm -rf logs

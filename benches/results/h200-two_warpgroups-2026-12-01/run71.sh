#!/usr/bin/env bash
# The two-warpgroup state pass in the engine: GPU suite, the prefill mixer against fla with the
# pass on / off alternating, the Qwen3.5 layout against transformers + fla, and its prefill with
# the pass off and on, in one call.
L=$OUT/logs; mkdir -p $L/mixer /tmp/n
tar -C /tmp/n -xJf .devbuild/k24.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
SECONDS=0
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? in ${SECONDS}s"
grep -E "GPU tests:|FAILED|panicked" $L/gpu_tests.log | head; grep -E "two-warpgroup|warpgroup pass" $L/gpu_tests.log
FLA=$(mktemp -d); pip install --quiet --no-deps --no-index --target "$FLA" .whl/*.whl 2>/dev/null
PYTHONPATH=$FLA timeout 100 python3 benches/fla_mixer.py $L/mixer/fla_mixer.json 2>$L/mixer/fla_mixer.log; echo "fla rc $?"
for r in 1 2; do
  timeout 60 /tmp/n/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/on_$r.md 2>&1; echo "on $r rc $?"
  DELTASERVE_TC_WS=0 timeout 60 /tmp/n/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/off_$r.md 2>&1; echo "off $r rc $?"
done
for f in $L/mixer/on_1.md $L/mixer/off_1.md $L/mixer/on_2.md $L/mixer/off_2.md; do echo $f; grep '^| [0-9]' $f; done
echo "at ${SECONDS}s"
PYTHONPATH=$FLA timeout 250 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1; echo "hybrid rc $? at ${SECONDS}s"
grep -iE 'prefill|speed|x ' $L/hybrid_vs_hf.log | tail -12
for r in 1 2; do
  DELTASERVE_TC_WS=0 timeout 60 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --batches 1 --reps 5 > $L/hybrid_ws_off_$r.md 2>&1
  timeout 60 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --batches 1 --reps 5 > $L/hybrid_ws_on_$r.md 2>&1
done
grep -iE 'prefill' $L/hybrid_ws_o*.md | head -12
cd $OUT && tar czf logs.tgz logs && rm -rf logs

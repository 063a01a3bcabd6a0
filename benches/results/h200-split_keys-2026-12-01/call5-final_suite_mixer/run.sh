#!/usr/bin/env bash
# The final build's GPU suite (the kernels rebuilt from every header: build.rs now watches each
# .cuh), then fla_mixer.py with its decode shapes first and the prefill mixer table, the
# split-key pass and mma.sync (DELTASERVE_TC_WG=0) alternating.
L=$OUT/logs; mkdir -p $L/mixer /tmp/n
tar -C /tmp/n -xJf .devbuild/t96.tar.xz
tar -C /tmp/n -xJf .devbuild/g96.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -c "^test .* ok$" $L/gpu_tests.log; grep -a "FAILED\|panicked\|warpgroup pass n=\|test result" $L/gpu_tests.log | head -20
FLA=$(mktemp -d); pip install --quiet --no-deps --no-index --target "$FLA" .whl/*.whl 2>/dev/null
PYTHONPATH=$FLA timeout 220 python3 benches/fla_mixer.py $L/mixer/fla_mixer.json 2>$L/mixer/fla_mixer.log; echo "fla rc $? at ${SECONDS}s"
grep 'prefill\|decode\|Error' $L/mixer/fla_mixer.log
timeout 60 /tmp/n/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/split_1.md 2>&1; echo "split rc $? at ${SECONDS}s"
DELTASERVE_TC_WG=0 timeout 60 /tmp/n/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/mma_1.md 2>&1; echo "mma rc $? at ${SECONDS}s"
for f in $L/mixer/split_1.md $L/mixer/mma_1.md; do echo $f; grep '^| [0-9]' $f; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# wgmma state pass always where eligible: GPU suite, probe, mixer against fla (wg on / off),
# the Qwen3.5 layout against transformers, and its prefill with the pass off, in one call.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/k19.tar.xz
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda benches/wg_state_probe.cu -o /tmp/wgp_a > $L/build_a.log 2>&1 &
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1; echo "gpu tests rc $?"
grep -E "test result|FAILED|panicked" $L/gpu_tests.log | head -20
grep "warpgroup" $L/gpu_tests.log | head -20
wait
timeout 100 /tmp/wgp_a > $L/probe_a.md 2>&1; echo "probe rc $?"
timeout 150 bash benches/mixer_vs_fla.sh /tmp/n/gpu_bench $L/mixer > $L/mixer_wg.log 2>&1; echo "mixer rc $?"
DELTASERVE_TC_WG=0 timeout 60 /tmp/n/gpu_bench --skip-model --fla-json $L/mixer/fla_mixer.json > $L/mixer/gpu_bench_mixers_wg_off.md 2>&1; echo "mixer off rc $?"
FLA=$(mktemp -d); pip install --quiet --no-deps --no-index --target "$FLA" .whl/*.whl
PYTHONPATH=$FLA timeout 240 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1; echo "hybrid rc $?"
DELTASERVE_TC_WG=0 timeout 90 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --batches 1 --reps 5 > $L/hybrid_wg_off.md 2>&1; echo "hybrid off rc $?"
timeout 90 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --batches 1 --reps 5 > $L/hybrid_wg_on.md 2>&1; echo "hybrid on rc $?"

#!/usr/bin/env bash
# wgmma state pass: probe, GPU suite, mixer against fla (wg on / off) in one call.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/k18.tar.xz
for v in "a:" "p:-DWG_PROFILE"; do n=${v%%:*}; f=${v#*:}; nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda $f benches/wg_state_probe.cu -o /tmp/wgp_$n > $L/build_$n.log 2>&1 & done
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1; echo "gpu tests rc $?"
grep -E "test result|FAILED|panicked" $L/gpu_tests.log | head -20
grep "warpgroup" $L/gpu_tests.log | head -20
wait
timeout 120 /tmp/wgp_a > $L/probe_a.md 2>&1; echo "probe rc $?"
timeout 60 /tmp/wgp_p > $L/probe_p.md 2>&1; echo "profile rc $?"
timeout 150 bash benches/mixer_vs_fla.sh /tmp/n/gpu_bench $L/mixer > $L/mixer_wg.log 2>&1; echo "mixer rc $?"
DELTASERVE_TC_WG=0 timeout 60 /tmp/n/gpu_bench --skip-model --fla-json $L/mixer/fla_mixer.json > $L/mixer/gpu_bench_mixers_wg_off.md 2>&1; echo "mixer off rc $?"
DELTASERVE_TC_WG=1 timeout 60 /tmp/n/gpu_bench --skip-model --fla-json $L/mixer/fla_mixer.json > $L/mixer/gpu_bench_mixers_wg_on.md 2>&1; echo "mixer forced rc $?"

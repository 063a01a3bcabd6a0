#!/usr/bin/env bash
# The split-key warpgroup state pass (K = 256): the probe's f64 checks and timings against the
# mma.sync entries, the GPU suite, then the 1.39B's prefill and decode with it and without it
# (DELTASERVE_TC_WG=0: the mma.sync pass), alternating, two rounds.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/n92.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
nvcc .devbuild/wgp.o -o /tmp/wgp > $L/probe_link.log 2>&1; echo "probe link rc $? at ${SECONDS}s"
timeout 100 /tmp/wgp > $L/probe.md 2>&1; echo "probe rc $? at ${SECONDS}s"
grep -a 'registers\|PASS\|FAIL\|^## \|^| \|differ' $L/probe.md | head -120
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -c "^test .* ok$" $L/gpu_tests.log; grep -a "FAILED\|panicked\|warpgroup pass n=\|test result" $L/gpu_tests.log | head -30
MODELS=gdn PREFILL=1 ROUNDS=2 BATCHES=1,64 TIMEOUT=80 timeout $((560 - SECONDS)) bash benches/ab_decode.sh $L/ab split=/tmp/n/gpu_bench "mma=DELTASERVE_TC_WG=0 /tmp/n/gpu_bench" > $L/ab.log 2>&1; echo "ab rc $? at ${SECONDS}s"
cat $L/ab/summary.md 2>/dev/null | head -30
cd $OUT && tar czf logs.tgz logs && rm -rf logs

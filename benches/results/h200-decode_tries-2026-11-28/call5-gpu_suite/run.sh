#!/bin/bash
# Device call: the GPU suite on this build (graph rebuild's later commits: kernel names through cuKernelGetName, arenas grown by doubling, relocation against live allocations), the cublasLt algorithm probe, and both models' decode steps.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/build_q35.log 2>&1) &
BUILD=$!
DELTASERVE_TESTS_DIR=$PWD/tests timeout 300 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
tail -2 $L/gpu_tests.log
timeout 60 /tmp/b/gpu_bench.final --gemm-algos > $L/algos.log 2>&1
wait $BUILD
timeout 120 /tmp/b/gpu_bench.final --model-only --no-prefill --graphs-only --model-dir /tmp/gdn13 --batches 1,16,64 > $L/model.log 2>&1
timeout 100 /tmp/b/gpu_bench.final --hybrid-dir /tmp/q35 --no-prefill --batches 1,16,64 > $L/hybrid.log 2>&1
grep -E "^\| [0-9]" $L/model.log
grep -E "decode" $L/hybrid.log | sed 's/"batch_invariant":false,//; s/"captured":\[[0-9]*\],"context":256,//; s/"graph":"[^"]*",//'
tar -C $L -czf $OUT/suite.tgz .

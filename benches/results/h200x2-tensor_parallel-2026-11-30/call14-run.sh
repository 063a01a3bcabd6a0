#!/bin/bash
# Session 18, call 14: the whole GPU suite on HEAD's test binary (one GPU).
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/k15.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run52.sh $L/run.sh
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
s=$(date +%s); DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T > $L/suite.log 2>&1
echo "suite rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|panicked" $L/suite.log | tail -5
cd $OUT && tar czf logs.tgz logs && rm -rf logs

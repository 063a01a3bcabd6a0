#!/bin/bash
# Call 5: the GPU suite with the final build's test binary (631e821).
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/tests.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run9.sh $L/run.sh
nvidia-smi --query-gpu=name --format=csv > $L/gpu.txt
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep "GPU tests:" $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head; grep "bf16 q/k/v\|f32 q/k/v" $L/gpu_tests.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 8: the GPU suite after the conv step's checks were shared with the folded conv.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run8.sh $L/run.sh
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 220 /tmp/n/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests:" $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -20
grep -E "folded into the input projection|GPU conv F32 offset 8 W=4 Silu" $L/gpu_tests.log | head -5
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 3: the one-row fused projections (norm prologues, SwiGLU) against the plain GEMV, and
# with W's first steps loaded before the prologue (benches/stage_probe.cu).
L=$OUT/logs; mkdir -p $L; cp .devbuild/run3.sh $L/run.sh; cp benches/stage_probe.cu $L/
nvcc -O3 -arch=sm_90a -std=c++17 -Ikernels/cuda benches/stage_probe.cu -o /tmp/stage_probe > $L/build.log 2>&1 && timeout 200 /tmp/stage_probe > $L/stage_probe.md 2>&1
echo "probe rc=$?"; cat $L/stage_probe.md; tail -3 $L/build.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

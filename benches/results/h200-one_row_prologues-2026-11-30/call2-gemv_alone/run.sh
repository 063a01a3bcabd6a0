#!/bin/bash
# Call 2: the one-row GEMV alone against a pure read of its bytes, and with W's loads issued
# PRE steps at a time (benches/gemv_probe.cu); the engine's gemv.cu in SASS.
L=$OUT/logs; mkdir -p $L; cp .devbuild/run2.sh $L/run.sh; cp benches/gemv_probe.cu $L/
nvcc -O3 -arch=sm_90a -std=c++17 -Ikernels/cuda benches/gemv_probe.cu -o /tmp/gemv_probe > $L/build.log 2>&1 && timeout 200 /tmp/gemv_probe > $L/gemv_probe.md 2>&1
echo "probe rc=$?"; cat $L/gemv_probe.md
nvcc -O3 -arch=sm_90a -std=c++17 -Ikernels/cuda -cubin benches/gemv_probe.cu -o /tmp/gp.cubin && cuobjdump -sass /tmp/gp.cubin > $L/gemv_probe.sass 2>&1
cd $OUT && tar czf logs.tgz logs && rm -rf logs

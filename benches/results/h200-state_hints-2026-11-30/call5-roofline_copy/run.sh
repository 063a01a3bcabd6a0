#!/bin/bash
# Call 5: this build's decode steps (three rounds) with the roofline's copy timed as the kernel
# alone (the GPU busy when its launch arrives), against the call-3 build's gpu_bench (`idle`:
# the same kernels, its copy timed from an idle GPU), alternating, so that both rooflines are
# measured in one call.
mkdir -p /tmp/n /tmp/r && tar -C /tmp/n -xJf .devbuild/t.tar.xz && tar -C /tmp/r -xJf .devbuild/r.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run5.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
ROUNDS=3 TIMEOUT=100 bash benches/ab_decode.sh $L/ab idle=/tmp/n/gpu_bench busy=/tmp/r/gpu_bench > $L/ab.out 2>&1
cat $L/ab/summary.md
grep -h "copy bandwidth" $L/ab/*.log | sort | uniq -c
cd $OUT && tar czf logs.tgz logs && rm -rf logs

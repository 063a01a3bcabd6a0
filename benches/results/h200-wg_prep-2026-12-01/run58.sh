#!/bin/bash
# prep probe: timing + ncu source-level profile of the bf16 chunk prep
mkdir -p $OUT/logs; L=$OUT/logs
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $L/gpu.txt 2>&1
nvcc -O3 -lineinfo -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda benches/prep_probe.cu -o /tmp/pp > $L/build.log 2>&1 || { cat $L/build.log; }
/tmp/pp 30 > $L/probe.txt 2>&1; cat $L/probe.txt
ncu --set full --import-source yes -k regex:chunk_tc_prep -s 0 -c 3 -o /tmp/prof /tmp/pp 3 > $L/ncu_run.log 2>&1
ncu -i /tmp/prof.ncu-rep --page details > $L/ncu_details.txt 2>&1
ncu -i /tmp/prof.ncu-rep --page source --csv --print-source sass > $L/ncu_source_sass.csv 2>$L/ncu_source.err
ncu -i /tmp/prof.ncu-rep --page source --csv --print-source cuda > $L/ncu_source_cuda.csv 2>>$L/ncu_source.err
ls -la $L; head -c 600 $L/ncu_source_sass.csv; cat $L/ncu_source.err | head
cuobjdump -sass /tmp/pp > $L/sass.txt 2>&1
cd $OUT && tar czf logs.tgz logs && rm -rf logs

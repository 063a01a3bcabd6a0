#!/bin/bash
mkdir -p $OUT/logs; L=$OUT/logs
nvcc -O3 -lineinfo -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda benches/prep_probe.cu -o /tmp/pp > $L/build.log 2>&1 || cat $L/build.log
/tmp/pp 30 > $L/probe.txt 2>&1; cat $L/probe.txt
ncu --set full --import-source yes -k regex:prep -s 8 -c 4 -o /tmp/prof /tmp/pp 2 > $L/ncu_run.log 2>&1
ncu -i /tmp/prof.ncu-rep --page details > $L/ncu_details.txt 2>&1
ncu -i /tmp/prof.ncu-rep --page source --csv --print-source sass > $L/ncu_source_sass.csv 2>$L/ncu_source.err
grep -E 'chunk_|Duration|Elapsed Cycles|Registers|Achieved Occupancy|Executed Ipc A|Instructions Executed ' $L/ncu_details.txt | head -40
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# Stall reasons and memory tables of layer 0's input projection of a 1.39B decode step, with the
# caches flushed between the profiler's replays: the skinny TMA kernel (batch 16), cuBLAS's
# kernel (batch 16, DELTASERVE_SKINNY_GEMM=0) and the one-row GEMV (batch 1). HEAD's gpu_bench.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/b119.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
V=/tmp/deltaserve-gdn-1.3b
timeout 150 /tmp/n/gpu_bench --model-only --graphs-only --no-prefill --batches 1 --model-dir $V > $L/model.log 2>&1; echo "model rc $? at ${SECONDS}s"
N="ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control all --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio --launch-count 1"
timeout 120 $N --kernel-name regex:skinny_bf16_bf16 --csv --page raw /tmp/n/gpu_bench --profile-decode 16 --model-dir $V > $L/skinny.csv 2> $L/skinny.err; echo "skinny rc $? at ${SECONDS}s"
DELTASERVE_SKINNY_GEMM=0 timeout 120 $N --kernel-name regex:nvjet --csv --page raw /tmp/n/gpu_bench --profile-decode 16 --model-dir $V > $L/cublas.csv 2> $L/cublas.err; echo "cublas rc $? at ${SECONDS}s"
timeout 120 $N --kernel-name regex:add_norm_gemv --csv --page raw /tmp/n/gpu_bench --profile-decode 1 --model-dir $V > $L/gemv.csv 2> $L/gemv.err; echo "gemv rc $? at ${SECONDS}s"
python3 - $L <<'PY'
import csv,sys,os
L=sys.argv[1]
keys=["gpu__time_duration.sum","dram__throughput.avg.pct_of_peak_sustained_elapsed","dram__bytes_read.sum","lts__t_sector_hit_rate.pct","sm__warps_active.avg.pct_of_peak_sustained_active","launch__grid_size","launch__block_size","launch__registers_per_thread","smsp__issue_active.avg.pct_of_peak_sustained_active"]
for name in ["skinny","cublas","gemv"]:
    rows=list(csv.reader(open(os.path.join(L,name+".csv"))))
    hdr=None
    for i,r in enumerate(rows):
        if "Kernel Name" in r: hdr=r; data=rows[i+2:]; units=rows[i+1]; break
    if not hdr or not data: print(name,"no data"); continue
    d=dict(zip(hdr,data[0])); u=dict(zip(hdr,units))
    print("==",name,d.get("Kernel Name"))
    for k in keys:
        if k in d: print("  %s = %s %s"%(k,d[k],u.get(k,"")))
    st=sorted(((float(d[k].replace(",","")) if d[k] not in ("","n/a") else 0.0,k) for k in hdr if k.startswith("smsp__average_warps_issue_stalled_")),reverse=True)[:8]
    for v,k in st: print("  %-80s %.2f"%(k,v))
PY
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# Nsight Compute on the one- and two-warpgroup state passes at 1x4096 and 8x2048 (probe shapes):
# pipe, shared-memory and scheduler figures.
L=$OUT/logs; mkdir -p $L
nvcc -O3 -lineinfo -gencode arch=compute_90a,code=sm_90a -std=c++17 -Ikernels/cuda benches/wg_state_probe.cu -o /tmp/wgs > $L/build.log 2>&1 || cat $L/build.log
ncu --query-metrics 2>/dev/null | grep -iE 'gmma|tensor_op|mem_shared' > $L/metric_names.txt
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats --section InstructionStats"
for shape in "1x4096 H=16 K=128" "8x2048 H=16 K=128" "8x2048 H=16 K=64"; do
  tag=$(echo $shape | tr ' =' '__')
  for k in chunk_wg_state_k chunk_wg_ws_k; do
    PROBE_ONLY="$shape" timeout 120 ncu $S -k regex:$k -c 1 /tmp/wgs > $L/ncu_${tag}_$k.txt 2>&1
    echo "== $shape $k"; grep -E 'Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Executed Ipc A|Shared .*(Load|Store)|Bank|Warp Cycles Per Issued|No Eligible|Active Warps Per|Registers Per|Avg. Executed Instructions Per Sched' $L/ncu_${tag}_$k.txt | head -24
  done
done
M=$(grep -oE 'sm__pipe_tensor_op_gmma_cycles_active|sm__inst_executed_pipe_tensor_op_gmma|l1tex__data_pipe_lsu_wavefronts_mem_shared|smsp__inst_executed_op_shared_ld|l1tex__data_bank_conflicts_pipe_lsu_mem_shared' $L/metric_names.txt | sort -u | sed 's/$/.sum/' | paste -sd,)
echo "metrics: $M"
for k in chunk_wg_state_k chunk_wg_ws_k; do
  PROBE_ONLY="8x2048 H=16 K=128" timeout 60 ncu --metrics "$M,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active" -k regex:$k -c 1 /tmp/wgs > $L/ncu_metrics_$k.txt 2>&1
  echo "== $k"; grep -E 'sm__|l1tex__|smsp__' $L/ncu_metrics_$k.txt
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

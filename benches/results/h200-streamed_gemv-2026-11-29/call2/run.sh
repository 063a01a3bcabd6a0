#!/bin/bash
# Call 2: where the streamed GEMVs lose: per-kernel times under Nsight Compute at batch 1, both
# models, streamed (n) and not (o).
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run2.sh $L/run.sh
[ -d /tmp/q35 ] || (python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1)
run() { case $1 in o) DELTASERVE_GEMV_STREAM=0 "${@:2}";; w) DELTASERVE_GEMV_STREAM_BYTES=200000 "${@:2}";; *) "${@:2}";; esac; }
NCU="ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw"
for b in o n; do
  run $b timeout 100 $NCU /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches 1 --reps 3 --profile-hybrid-decode 1 > $L/ncu-q35-b1-$b.csv 2> $L/ncu-q35-b1-$b.err
  python3 benches/ncu_kernels.py "Qwen3.5-layout decode step, batch 1 ($b)" $L/ncu-q35-b1-$b.csv > $L/kernels-q35-b1-$b.md 2>&1
  head -30 $L/kernels-q35-b1-$b.md | tail -18
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

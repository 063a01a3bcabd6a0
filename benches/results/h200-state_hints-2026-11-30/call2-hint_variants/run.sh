#!/bin/bash
# Call 2: streaming hints on the recurrent state's loads and stores (both, loads only, stores
# only; each with the conv state's hints) and on the conv state alone, against none; one binary,
# env switches, alternating, two rounds. Then the 1.39B's and the Qwen3.5 layout's batch-64 step
# per kernel under Nsight Compute, without and with the hints.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run2.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
B=/tmp/n/gpu_bench
C=DELTASERVE_CONV_HINTS=1
ROUNDS=2 TIMEOUT=100 bash benches/ab_decode.sh $L/ab base=$B "conv=$C $B" "cs=DELTASERVE_STATE_HINTS=1 $C $B" "csl=DELTASERVE_STATE_HINTS=ld $C $B" "css=DELTASERVE_STATE_HINTS=st $C $B" > $L/ab.out 2>&1
cat $L/ab/summary.md
prof() {  # name, "VAR=value ...", then gpu_bench's arguments
  local name=$1 envs=$2; shift 2
  timeout 100 env $envs ncu --profile-from-start off --graph-profiling node --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
    $B "$@" > $L/ncu-$name.csv 2> $L/ncu-$name.err
  python3 benches/ncu_kernels.py "$name" $L/ncu-$name.csv > $L/kernels-$name.md 2>&1
  head -14 $L/kernels-$name.md | tail -11
}
for v in base cs; do
  E="DELTASERVE_NONE=1"; [ $v = cs ] && E="DELTASERVE_STATE_HINTS=1 $C"
  prof q35-b64-$v "$E" --hybrid-dir /tmp/q35 --reps 3 --profile-hybrid-decode 64
  prof gdn-b64-$v "$E" --profile-decode 64 --model-dir /tmp/deltaserve-gdn-1.3b
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

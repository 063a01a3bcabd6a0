#!/bin/bash
# Call 4: the skinny GEMM at 4-32 rows (cp.async staging): its tests, decode steps with cuBLAS
# (DELTASERVE_SKINNY_GEMM=0, o), the skinny kernel (n) and the skinny kernel launched without the
# programmatic wait (DELTASERVE_SKINNY_NO_WAIT=1, p), alternating; then gpu_bench --skinny.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run4.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
(python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1) &
DELTASERVE_TESTS_DIR=$PWD/tests timeout 90 /tmp/n/gpu_tests skinny small_batch_linear > $L/gpu_tests.log 2>&1; echo "tests rc=$?"; grep -E "GPU tests:" $L/gpu_tests.log; grep -E "panicked" -A3 $L/gpu_tests.log | head
M=/tmp/gdn13
timeout 60 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 1 > /dev/null 2>&1
run() { case $1 in o) DELTASERVE_SKINNY_GEMM=0 "${@:2}";; p) DELTASERVE_SKINNY_NO_WAIT=1 "${@:2}";; *) "${@:2}";; esac; }
for b in o n p o n p; do
  run $b timeout 40 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 4,8,16,32 > $L/model-$b.log 2>&1
  echo "gdn $b: $(grep -E '^\| [0-9]+ \| yes' $L/model-$b.log | awk -F'|' '{printf "%s:%s(%s) ", $2, $4, $7}')"
done
wait
for b in o n p o n p; do
  run $b timeout 40 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches 8,16,32 > $L/q35-$b.log 2>&1
  echo "q35 $b: $(grep -o '"batch":[0-9]*,"context":256,"ms":[0-9.]*' $L/q35-$b.log | sed 's/"context":256,//' | tr '\n' ' ')"
done
timeout 100 /tmp/n/gpu_bench --skinny > $L/skinny.log 2>&1
python3 - $L/skinny.log <<'PY'
import json,sys
rows={}
for l in open(sys.argv[1]):
    if l.startswith("SKINNY "):
        d=json.loads(l[7:]); rows.setdefault((d["name"],d["m"]),[]).append((d["path"],d["us"]))
for (n,m),v in rows.items():
    print(f"{n:13s} m={m:2d} " + " ".join(f"{p}:{u:.1f}" for p,u in v))
PY
cd $OUT && tar czf logs.tgz logs && rm -rf logs

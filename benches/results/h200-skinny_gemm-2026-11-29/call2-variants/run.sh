#!/bin/bash
# Call 3: the skinny GEMM's variants against cuBLAS at the narrow projections, 4-64 rows, W
# streamed from memory (gpu_bench --skinny).
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run3.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
DELTASERVE_TESTS_DIR=$PWD/tests timeout 60 /tmp/n/gpu_tests gpu_small_batch_linear_matches_cpu > $L/gpu_tests.log 2>&1; echo "tests rc=$?"; grep -E "GPU tests:" $L/gpu_tests.log
timeout 200 /tmp/n/gpu_bench --skinny > $L/skinny.log 2>&1
echo "skinny rc=$?"
python3 - $L/skinny.log <<'PY'
import json,sys
rows={}
for l in open(sys.argv[1]):
    if l.startswith("SKINNY "):
        d=json.loads(l[7:]); rows.setdefault((d["name"],d["m"]),[]).append((d["path"],d["us"]))
for (n,m),v in rows.items():
    print(f"{n:13s} m={m:2d} " + " ".join(f"{p.replace('skinny','sk').replace('SwiGLU','sw')}:{u:.1f}" for p,u in v))
PY
cd $OUT && tar czf logs.tgz logs && rm -rf logs

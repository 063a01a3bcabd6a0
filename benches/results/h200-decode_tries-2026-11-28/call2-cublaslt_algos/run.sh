#!/bin/bash
# Device call: every cublasLt heuristic algorithm at the decode step's projection shapes, 9-64 rows.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
timeout 400 /tmp/b/gpu_bench.algos --gemm-algos > $L/algos.log 2>&1
echo rc=$?
python3 - $L/algos.log <<'PY'
import json,sys
rows=[json.loads(l[5:]) for l in open(sys.argv[1]) if l.startswith("ALGO ")]
from collections import defaultdict
g=defaultdict(list)
for r in rows: g[(r["model"],r["name"],r["m"])].append(r)
for key,rs in g.items():
    d=rs[0]; b=min(rs,key=lambda r:r["us"])
    print(f"{key[0]:8s} {key[1]:13s} m={key[2]:3d} n={len(rs):2d} pick0 {d['us']:6.2f}us {d['tbs']:.2f}TB/s | best #{b['pick']} {b['us']:6.2f}us {b['tbs']:.2f}TB/s {b['algo']} | pick0 {d['algo']}")
PY

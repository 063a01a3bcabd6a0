#!/usr/bin/env bash
# The skinny GEMM with slices for the narrow projections and the row kernels triggering it
# early: the GPU suite, the kernel alone against cuBLAS, then decode steps cuBLAS / skinny /
# skinny without the early trigger, alternating, one round, both models.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t104.tar.xz; tar -C /tmp/n -xJf .devbuild/b104.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 230 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:" $L/gpu_tests.log | head -20; grep -a "skinny" $L/gpu_tests.log | head -5
timeout 110 /tmp/n/gpu_bench --skinny > $L/skinny.log 2>&1; echo "skinny bench rc $? at ${SECONDS}s"
python3 - $L/skinny.log <<'PY'
import json,sys,collections
rows=[json.loads(l.split(' ',1)[1]) for l in open(sys.argv[1]) if l.startswith('SKINNY ')]
t=collections.defaultdict(dict)
for r in rows: t[(r['model'],r['name'])][(r['m'],r['path'])]=r['us']
for key,d in t.items():
    for m in (4,16,64):
        items=sorted([(v,p) for (mm,p),v in d.items() if mm==m and p!='cuBLAS'])
        auto=[f"{v:.1f}" for v,p in items if 'auto' in p]
        print(key[0],key[1],'m',m,'cuBLAS %.1f'%d.get((m,'cuBLAS'),0),'auto',auto,'best',' '.join(f"{p.replace('skinny ','')}:{v:.1f}" for v,p in items[:3]))
PY
MODELS="gdn q35" ROUNDS=1 BATCHES=4,16,64 TIMEOUT=70 timeout $((585 - SECONDS)) bash benches/ab_decode.sh $L/ab \
  "off=DELTASERVE_SKINNY_GEMM=0 /tmp/n/gpu_bench" "on=/tmp/n/gpu_bench" "late=DELTASERVE_PDL_EARLY=0 /tmp/n/gpu_bench" > $L/ab.log 2>&1; echo "ab rc $? at ${SECONDS}s"
cat $L/ab/summary.md
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

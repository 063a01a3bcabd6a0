#!/usr/bin/env bash
# The skinny GEMM with x multicast across row tiles: its tests, the kernel alone against cuBLAS,
# then decode steps cuBLAS / skinny / skinny with multicast 2 / 4, alternating, two rounds.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t105.tar.xz; tar -C /tmp/n -xJf .devbuild/b105.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
DELTASERVE_TESTS_DIR=$PWD/tests timeout 120 /tmp/n/gpu_tests gpu_skinny_gemm_matches_cpu gpu_split_projections_leave_a_models_logits gpu_decode_graphs_equal_eager_decode gpu_mixed_graphs_equal_eager_mixed_passes --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "^test \|FAILED\|panicked\|GPU tests:" $L/gpu_tests.log | head -12; grep -a "skinny" $L/gpu_tests.log | tail -3
timeout 130 /tmp/n/gpu_bench --skinny > $L/skinny.log 2>&1; echo "skinny bench rc $? at ${SECONDS}s"
python3 - $L/skinny.log <<'PY'
import json,sys,collections
rows=[json.loads(l.split(' ',1)[1]) for l in open(sys.argv[1]) if l.startswith('SKINNY ')]
t=collections.defaultdict(dict)
for r in rows: t[(r['model'],r['name'])][(r['m'],r['path'])]=r['us']
for key,d in t.items():
    for m in (4,16,64):
        items=sorted([(v,p) for (mm,p),v in d.items() if mm==m and p!='cuBLAS'])
        auto=[f"{v:.1f}" for v,p in items if 'auto' in p]
        print(key[0],key[1],'m',m,'cuBLAS %.1f'%d.get((m,'cuBLAS'),0),'auto',auto,'best',' '.join(f"{p.replace('skinny ','')}:{v:.1f}" for v,p in items[:4]))
PY
MODELS="gdn q35" ROUNDS=2 BATCHES=4,16,64 TIMEOUT=70 timeout $((585 - SECONDS)) bash benches/ab_decode.sh $L/ab \
  "off=DELTASERVE_SKINNY_GEMM=0 /tmp/n/gpu_bench" "on=/tmp/n/gpu_bench" "mc2=DELTASERVE_SKINNY_MULTICAST=2 /tmp/n/gpu_bench" "mc4=DELTASERVE_SKINNY_MULTICAST=4 /tmp/n/gpu_bench" > $L/ab.log 2>&1; echo "ab rc $? at ${SECONDS}s"
cat $L/ab/summary.md
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

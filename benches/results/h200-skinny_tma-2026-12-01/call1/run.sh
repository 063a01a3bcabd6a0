#!/usr/bin/env bash
# The skinny GEMM (TMA + wgmma, 4-64 rows): its GPU test and cuBLAS's tests beside it, the
# kernel alone against cuBLAS at the decode shapes, then decode steps with it off and on,
# alternating, two rounds, both models.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t103.tar.xz; tar -C /tmp/n -xJf .devbuild/b103.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
DELTASERVE_TESTS_DIR=$PWD/tests timeout 170 /tmp/n/gpu_tests gpu_skinny_gemm_matches_cpu gpu_gemm_matches_cpu gpu_gemm_f32_output_is_the_unrounded_product gpu_split_projection_slices_sum_to_the_product gpu_split_projections_leave_a_models_logits --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "^test \|FAILED\|panicked\|GPU tests:\|skinny" $L/gpu_tests.log | head -30
timeout 150 /tmp/n/gpu_bench --skinny > $L/skinny.log 2>&1; echo "skinny bench rc $? at ${SECONDS}s"
python3 - $L/skinny.log <<'PY'
import json,sys,collections
rows=[json.loads(l.split(' ',1)[1]) for l in open(sys.argv[1]) if l.startswith('SKINNY ')]
best=collections.OrderedDict()
for r in rows:
    key=(r['model'],r['name'],r['m'])
    best.setdefault(key,{})
    d=best[key]
    p=r['path']
    if p=='cuBLAS': d['cublas']=r['us']
    elif p.startswith('skinny auto'): d['auto']=(r['us'],p)
    else:
        if 'best' not in d or r['us']<d['best'][0]: d['best']=(r['us'],p)
for (m,n,rows_),d in best.items():
    c=d.get('cublas'); a=d.get('auto'); b=d.get('best')
    print(f"{m:8s} {n:12s} m={rows_:3d} cuBLAS {c or 0:7.2f}  auto {a[0] if a else 0:7.2f} {a[1] if a else ''}  best {b[0] if b else 0:7.2f} {b[1] if b else ''}")
PY
MODELS="gdn q35" ROUNDS=2 BATCHES=1,4,16,64 TIMEOUT=70 timeout $((585 - SECONDS)) bash benches/ab_decode.sh $L/ab \
  "off=DELTASERVE_SKINNY_GEMM=0 /tmp/n/gpu_bench" "on=/tmp/n/gpu_bench" > $L/ab.log 2>&1; echo "ab rc $? at ${SECONDS}s"
cat $L/ab/summary.md
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

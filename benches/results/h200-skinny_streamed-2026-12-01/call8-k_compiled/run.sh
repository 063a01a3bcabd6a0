#!/usr/bin/env bash
# The skinny TMA kernel with a compiled-in count of k tiles a stage (1 or 2): its tests; the
# kernel alone against cuBLAS; decode steps cuBLAS / one tile a stage / two / two with 128 rows
# of W a block, alternating, two rounds, both models.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t118.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests gpu_skinny_gemm_matches_cpu gpu_split_projections_leave_a_models_logits gpu_gemm_f32_output_is_the_unrounded_product --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:" $L/gpu_tests.log | head -20
timeout 150 /tmp/n/gpu_bench --skinny > $L/skinny.log 2>&1; echo "skinny rc $? at ${SECONDS}s"
python3 - $L/skinny.log <<'PY'
import json,sys,collections
rows=collections.defaultdict(dict)
for l in open(sys.argv[1]):
    if l.startswith("SKINNY "):
        d=json.loads(l[7:]); rows[(d["model"],d["name"],d["m"])][d["path"]]=d["us"]
for key,p in rows.items():
    if key[2] not in (4,16,64) or "parts" in " ".join(p): continue
    sk={k:v for k,v in p.items() if k!="cuBLAS" and ("auto" in k or "k2" in k or "k4" in k or k.endswith("w1s1r8") or "w2s1r11" in k)}
    print(key, "cuBLAS %.2f"%p.get("cuBLAS",0), " ".join("%s %.2f"%(k.replace("skinny ",""),v) for k,v in sorted(sk.items())))
PY
MODELS="gdn q35" ROUNDS=2 BATCHES=4,8,16 TIMEOUT=70 timeout $((560 - SECONDS)) bash benches/ab_decode.sh $L/ab \
  "cublas=DELTASERVE_SKINNY_GEMM=0 /tmp/n/gpu_bench" "ks1=/tmp/n/gpu_bench" "ks2=DELTASERVE_SKINNY_KS=2 /tmp/n/gpu_bench" "ks2w2=DELTASERVE_SKINNY_KS=2 DELTASERVE_SKINNY_WG=2 /tmp/n/gpu_bench" > $L/ab.log 2>&1; echo "ab rc $? at ${SECONDS}s"
cat $L/ab/summary.md
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# The streamed kernel, 128 columns a step (256-byte runs of a row), a ring of 3 steps a warp:
# its test and the TMA kernel's; the kernels alone against cuBLAS; decode steps cuBLAS / TMA /
# streamed (to 16 rows) / streamed to 64 rows, alternating, one round on the 1.39B.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t113.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests gpu_skinny_streamed_matches_cpu gpu_skinny_gemm_matches_cpu gpu_split_projections_leave_a_models_logits gpu_gemm_f32_output_is_the_unrounded_product --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:\|passed\|ok" $L/gpu_tests.log | head -20
timeout 150 /tmp/n/gpu_bench --skinny > $L/skinny.log 2>&1; echo "skinny rc $? at ${SECONDS}s"
python3 - $L/skinny.log <<'PY'
import json,sys,collections
rows=collections.defaultdict(dict)
for l in open(sys.argv[1]):
    if l.startswith("SKINNY "):
        d=json.loads(l[7:]); rows[(d["model"],d["name"],d["m"])][d["path"]]=d["us"]
for key,p in rows.items():
    best=min((v,k) for k,v in p.items() if k.startswith("streamed"))if any(k.startswith("streamed") for k in p) else None
    auto=[ (k,v) for k,v in p.items() if "auto" in k]
    print(key, "cuBLAS %.2f"%p.get("cuBLAS",0), " ".join("%s %.2f"%(k,v) for k,v in auto), "best streamed %s %.2f"%(best[1],best[0]) if best else "")
PY
MODELS="gdn" ROUNDS=1 BATCHES=4,8,16,32,64 TIMEOUT=70 timeout $((560 - SECONDS)) bash benches/ab_decode.sh $L/ab \
  "cublas=DELTASERVE_SKINNY_GEMM=0 /tmp/n/gpu_bench" "tma=DELTASERVE_SKINNY_STREAMED=0 /tmp/n/gpu_bench" "ss=/tmp/n/gpu_bench" "ss64=DELTASERVE_SKINNY_ROWS=64 /tmp/n/gpu_bench" > $L/ab.log 2>&1; echo "ab rc $? at ${SECONDS}s"
cat $L/ab/summary.md
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

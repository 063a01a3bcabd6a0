#!/bin/bash
# Session 16, call 1: the GPU suite on the rebased flat-grid prep branch plus the paired bf16
# chunk prep (its new bit-for-bit test among them); the Qwen3.5 prefill with the paired prep off
# and on (one binary, alternating, two rounds); cublasLt's first 16 algorithms at 4,096 rows.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/p1.tar.xz
cp .devbuild/run25.sh $OUT/run.sh
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 260 /tmp/n/gpu_tests $T > $OUT/gpu_tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|test result" $OUT/gpu_tests.log | tail -4
s=$(date +%s)
python3 -c "import sys; sys.path.insert(0, 'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $OUT/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - s )) s"
for r in 1 2; do
  for v in off on; do
    p=1; [ $v = off ] && p=0
    DELTASERVE_PREP_PAIRS=$p timeout 40 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --batches 1 --reps 3 > $OUT/q35-$r-$v.log 2>&1
    echo "$r $v: $(grep '"what":"prefill"' $OUT/q35-$r-$v.log | sed 's/.*"algo":"\([A-Za-z0-9]*\)".*"ms":\([0-9.]*\).*/\1 \2/' | tr '\n' ' ') $(( $(date +%s) - s )) s"
  done
done
s=$(date +%s)
timeout 120 /tmp/n/gpu_bench --gemm-algos --gemm-algos-rows 4096 > $OUT/algos4096.log 2>&1
echo "algos rc=$? $(( $(date +%s) - s )) s"
python3 - $OUT/algos4096.log <<'PY'
import json,sys,collections
rows=[json.loads(l[5:]) for l in open(sys.argv[1]) if l.startswith('ALGO ')]
by=collections.defaultdict(list)
for r in rows: by[(r['model'],r['name'])].append(r)
for k,v in by.items():
    d=[x for x in v if x['pick']==0][0]; b=min(v,key=lambda x:x['us'])
    print(k, 'default %.1f us (%.0f TF)'%(d['us'],d['tflops']), 'best pick %d %.1f us (%.0f TF) %s'%(b['pick'],b['us'],b['tflops'],b['algo']))
PY

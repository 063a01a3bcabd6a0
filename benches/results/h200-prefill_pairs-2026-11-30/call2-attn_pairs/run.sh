#!/bin/bash
# Session 16, call 2: the fixed paired prep (shared memory for two K-wide tiles) and the
# two-head prefill attention at d = 256. The changed tests first, then the whole suite; the
# Qwen3.5 prefill with each pairing off and on (one binary, alternating, two rounds); cublasLt's
# algorithms at 4,096 rows with each one's bits against the default's.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/p2.tar.xz
cp .devbuild/run26.sh $OUT/run.sh
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests gpu_paired_prep_equals_one_head_a_cta gpu_paged_attention_matches_cpu gpu_chunk_boundaries_match_cpu gpu_packed_prefill_equals_prefilling_each_alone gpu_raw_decode_step_equals_prepare_then_step > $OUT/gpu_tests_changed.log 2>&1
echo "changed tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|paired prep|head a block" $OUT/gpu_tests_changed.log | tail -8
s=$(date +%s)
python3 -c "import sys; sys.path.insert(0, 'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $OUT/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - s )) s"
for r in 1 2; do
  for v in on attn_off prep_off off; do
    a=1; p=1
    case $v in attn_off) a=0;; prep_off) p=0;; off) a=0; p=0;; esac
    DELTASERVE_ATTN_HEAD_PAIRS=$a DELTASERVE_PREP_PAIRS=$p timeout 40 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --batches 1 --reps 3 > $OUT/q35-$r-$v.log 2>&1
    echo "$r $v: $(grep '"what":"prefill"' $OUT/q35-$r-$v.log | sed 's/.*"algo":"\([A-Za-z0-9]*\)".*"ms":\([0-9.]*\).*/\1 \2/' | tr '\n' ' ') $(( $(date +%s) - s )) s"
  done
done
s=$(date +%s)
timeout 120 /tmp/n/gpu_bench --gemm-algos --gemm-algos-rows 4096,1024 > $OUT/algos.log 2>&1
echo "algos rc=$? $(( $(date +%s) - s )) s"
python3 - $OUT/algos.log <<'PY'
import json,sys,collections
rows=[json.loads(l[5:]) for l in open(sys.argv[1]) if l.startswith('ALGO ')]
by=collections.defaultdict(list)
for r in rows: by[(r['model'],r['name'],r['m'])].append(r)
for k,v in by.items():
    d=[x for x in v if x['pick']==0][0]; b=min(v,key=lambda x:x['us'])
    print(k, 'default %.1f us'%d['us'], 'best pick %d %.1f us'%(b['pick'],b['us']), 'differing', [x['differing'] for x in v])
PY
s=$(date +%s)
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 300 /tmp/n/gpu_tests $T > $OUT/gpu_tests.log 2>&1
echo "suite rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked" $OUT/gpu_tests.log | tail -4

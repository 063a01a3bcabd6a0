#!/bin/bash
# Call 1: the decode step with the recurrent state's (and the conv state's) loads and stores
# marked streaming, against the same binary without (env switches), alternating; then the
# cublasLt algorithms for the 2,048-row projections with an f32 output and in-place split-K.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run1.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
B=/tmp/n/gpu_bench
ROUNDS=2 TIMEOUT=100 bash benches/ab_decode.sh $L/ab base=$B "step_cs=DELTASERVE_STATE_HINTS=1 $B" "both_cs=DELTASERVE_STATE_HINTS=1 DELTASERVE_CONV_HINTS=1 $B" > $L/ab.out 2>&1
cat $L/ab/summary.md
timeout 200 $B --gemm-algos > $L/algos.log 2>&1; echo "algos rc=$?"
grep '^ALGO' $L/algos.log | python3 -c "
import sys, json
best = {}
for l in sys.stdin:
    d = json.loads(l[5:])
    key = (d['model'], d['name'], d['m'], d.get('variant', 'bf16'))
    if key not in best or d['us'] < best[key]['us']: best[key] = d
for k, d in sorted(best.items()):
    print(*k, 'pick', d['pick'], '%.2f us' % d['us'], '%.2f TB/s' % d['tbs'], d['algo'])
"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

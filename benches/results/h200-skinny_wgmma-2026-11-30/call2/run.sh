#!/bin/bash
# Call 2: the skinny warpgroup GEMM with eight tiles in flight (w1s8r8 picked): its GPU test,
# the kernel alone against cuBLAS, and decode steps with it up to 64 rows (n), up to 16 (p) and
# cuBLAS (o: DELTASERVE_SKINNY_GEMM=0), alternating.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run2.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
DELTASERVE_TESTS_DIR=$PWD/tests timeout 180 /tmp/n/gpu_tests gpu_skinny_gemm_matches_cpu > $L/test_skinny.log 2>&1
echo "skinny test rc=$?"; tail -4 $L/test_skinny.log
timeout 200 /tmp/n/gpu_bench --skinny > $L/skinny.log 2>&1
echo "bench rc=$?"
grep '^SKINNY' $L/skinny.log | python3 -c "
import sys,json
rows={}
for l in sys.stdin:
  d=json.loads(l[7:]); rows.setdefault((d['model'],d['name'],d['m']),[]).append((d['path'],d['us']))
for k,v in rows.items(): print(k[0],k[1],k[2],' '.join('%s=%.1f'%(p.replace('skinny ','').replace(' (picks ','(').replace(')',''),u) for p,u in v if 'picks' not in p))"
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
M=/tmp/gdn13
run() { case $1 in o) DELTASERVE_SKINNY_GEMM=0 "${@:2}";; p) DELTASERVE_SKINNY_ROWS=16 "${@:2}";; *) "${@:2}";; esac; }
i=0
for b in o n p o n p; do
  i=$((i+1))
  run $b timeout 60 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches 4,8,16,32,64 > $L/q35-$i-$b.log 2>&1
  echo "q35 $b: $(grep -h '"decode"' $L/q35-$i-$b.log | python3 -c "
import sys,json
for l in sys.stdin:
  d=json.loads(l[5:]); print(d['batch'], '%.4f' % d['ms'], '%.2f%%' % (100*d['roofline_ms']/d['ms']), end='  ')")"
done
for b in o n p o n p; do
  i=$((i+1))
  run $b timeout 60 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 4,8,16,32,64 > $L/model-$i-$b.log 2>&1
  echo "gdn $b: $(grep -E '^\| [0-9]+ \| yes' $L/model-$i-$b.log | awk -F'|' '{printf "%s: %.4f ms %s ", $2, 1000*$2/$5, $7}')"
done
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests gpu_gemm_matches_cpu gpu_small_batch_linear_matches_cpu gpu_decode_graphs_equal_eager_decode gpu_models_match_cpu_and_goldens gpu_mixed_graphs_equal_eager_mixed_passes > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAIL|panicked" $L/tests.log | tail -8
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 5: call 4's build (h) with thread 0 forming β and the decay of one-column tiles before
# storing either (n, this build), against HEAD (b): the step kernels' GPU tests, then decode
# steps alternating, two rounds.
mkdir -p /tmp/n /tmp/b /tmp/h && tar -C /tmp/n -xJf .devbuild/t.tar.xz && tar -C /tmp/b -xJf .devbuild/base.tar.xz && tar -C /tmp/h -xJf .devbuild/h4.tar.xz ./gpu_bench
L=$OUT/logs; mkdir -p $L; cp .devbuild/run5.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests gpu_raw_decode_step gpu_decode_in_any_slot_order gpu_decode_graphs_equal_eager gpu_batch_invariant_mode gpu_models_match_cpu_and_goldens gpu_mixed_graphs_equal_eager gpu_prefix_cache_snapshots gpu_warm_up > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "GPU tests|FAIL|panicked" $L/tests.log | tail -5
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
run() { local t=$1 v=$2; shift 2; timeout $t /tmp/$v/gpu_bench "$@"; }
i=0
for r in 1 2; do for v in b h n; do
  i=$((i+1))
  run 60 $v --hybrid-dir /tmp/q35 --no-prefill --batches 1,4,16,64 > $L/q35-$i-$v.log 2>&1
  echo "q35 $v: $(grep -h '"decode"' $L/q35-$i-$v.log | python3 -c "
import sys,json
for l in sys.stdin:
  d=json.loads(l[5:]); print(d['batch'], '%.4f' % d['ms'], '%.2f%%' % (100*d['roofline_ms']/d['ms']), end='  ')")"
done; done
M=/tmp/gdn13
for r in 1 2; do for v in b h n; do
  i=$((i+1))
  run 90 $v --model-only --no-prefill --graphs-only --model-dir $M --batches 1,4,16,64 > $L/model-$i-$v.log 2>&1
  echo "gdn $v: $(grep -E '^\| [0-9]+ \| yes' $L/model-$i-$v.log | awk -F'|' '{printf "%s: %.4f ms %s ", $2, 1000*$2/$5, $7}')"
done; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 1: the decode step's first-step inputs loaded before its state (one round trip), and the
# pipelined step kernel. GPU tests of the step kernels, then decode steps: HEAD's gpu_bench (b)
# against this build by default (auto: pipelined from 4 tiles an SM), with DELTASERVE_DECODE_PIPE=0
# (early inputs only) and with forced pipelined shapes, alternating, two rounds.
mkdir -p /tmp/n /tmp/b && tar -C /tmp/n -xJf .devbuild/t.tar.xz && tar -C /tmp/b -xJf .devbuild/base.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run1.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests gpu_pipelined_decode_step gpu_raw_decode_step gpu_decode_in_any_slot_order gpu_decode_graphs_equal_eager gpu_batch_invariant_mode > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "GPU tests|FAIL|panicked" $L/tests.log | tail -5
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
run() { local t=$1 v=$2; shift 2; case $v in b) timeout $t /tmp/b/gpu_bench "$@";; n) timeout $t /tmp/n/gpu_bench "$@";; p0) DELTASERVE_DECODE_PIPE=0 timeout $t /tmp/n/gpu_bench "$@";; *) DELTASERVE_DECODE_KERNEL=$v timeout $t /tmp/n/gpu_bench "$@";; esac; }
i=0
for r in 1 2; do for v in b n p0 w16_r8_c4_s3_b1 w16_r8_c2_s2_b2; do
  i=$((i+1))
  run 60 $v --hybrid-dir /tmp/q35 --no-prefill --batches 1,16,64 > $L/q35-$i-$v.log 2>&1
  echo "q35 $v: $(grep -h '"decode"' $L/q35-$i-$v.log | python3 -c "
import sys,json
for l in sys.stdin:
  d=json.loads(l[5:]); print(d['batch'], '%.4f' % d['ms'], '%.2f%%' % (100*d['roofline_ms']/d['ms']), end='  ')")"
done; done
M=/tmp/gdn13
for r in 1 2; do for v in b n p0 w16_r16_c2_s3_b1 w32_r8_c2_s2_b1; do
  i=$((i+1))
  run 90 $v --model-only --no-prefill --graphs-only --model-dir $M --batches 1,16,64 > $L/model-$i-$v.log 2>&1
  echo "gdn $v: $(grep -E '^\| [0-9]+ \| yes' $L/model-$i-$v.log | awk -F'|' '{printf "%s: %.4f ms %s ", $2, 1000*$2/$5, $7}')"
done; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

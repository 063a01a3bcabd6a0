#!/bin/bash
# Call 4 (an experiment, not a build to keep): what a replayed decode step's host-side edges cost.
# b: as built; u: the three input uploads skipped (DELTASERVE_EXP_NO_UPLOAD=1: the graph reads
# the previous step's inputs); c: the logits returned in the graph's own buffer, not copied
# (DELTASERVE_EXP_NO_COPY=1); uc: both. Alternating, two rounds.
mkdir -p /tmp/e && tar -C /tmp/e -xJf .devbuild/exp.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run4.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
M=/tmp/gdn13
run() { case $1 in u) DELTASERVE_EXP_NO_UPLOAD=1 "${@:2}";; c) DELTASERVE_EXP_NO_COPY=1 "${@:2}";; uc) DELTASERVE_EXP_NO_UPLOAD=1 DELTASERVE_EXP_NO_COPY=1 "${@:2}";; *) "${@:2}";; esac; }
i=0
for b in b u c uc b u c uc; do
  i=$((i+1))
  run $b timeout 60 /tmp/e/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches 1,2,64 > $L/q35-$i-$b.log 2>&1
  echo "q35 $b: $(grep -h '"decode"' $L/q35-$i-$b.log | python3 -c "
import sys,json
for l in sys.stdin:
  d=json.loads(l[5:]); print(d['batch'], '%.4f' % d['ms'], '%.2f%%' % (100*d['roofline_ms']/d['ms']), end='  ')")"
done
for b in b u c uc b u c uc; do
  i=$((i+1))
  run $b timeout 60 /tmp/e/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 1,16,64 > $L/model-$i-$b.log 2>&1
  echo "gdn $b: $(grep -E '^\| [0-9]+ \| yes' $L/model-$i-$b.log | awk -F'|' '{printf "%s: %.4f ms %s ", $2, 1000*$2/$5, $7}')"
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

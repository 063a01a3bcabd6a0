#!/bin/bash
# Prefill's latency-bound row kernels, call 2: q/k normalisation with its loads unrolled (prep),
# the conv's window rows loaded with its tile, gated norms keeping rows of 128/256. The GPU suite
# on the new build; prefill T=4096 of both models, HEAD (base) against new, alternating, two
# rounds, plus the 1.39B's D=512 gated norm with 4 and 8 kept; the Qwen3.5 prefill profiled.
mkdir -p /tmp/n /tmp/b && tar -C /tmp/n -xJf .devbuild/n1.tar.xz && tar -C /tmp/b -xJf .devbuild/b0.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run19.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
python3 -c "import sys; sys.path.insert(0, 'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - s )) s"
s=$(date +%s)
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|passed|failed" $L/gpu_tests.log | tail -5
s=$(date +%s)
/tmp/b/gpu_bench --model-only --reps 3 > /dev/null 2>&1
for r in 1 2; do
  for v in base new; do
    timeout 90 /tmp/${v:0:1}/gpu_bench --hybrid-dir /tmp/q35 --batches 1 --reps 3 > $L/q35-$r-$v.log 2>&1
    timeout 90 /tmp/${v:0:1}/gpu_bench --model-only --reps 3 > $L/gdn-$r-$v.log 2>&1
  done
  for kept in 4 8; do
    DELTASERVE_GATED_NORM_KEPT=$kept timeout 90 /tmp/n/gpu_bench --model-only --reps 3 > $L/gdn-$r-kept$kept.log 2>&1
  done
done
echo "ab $(( $(date +%s) - s )) s"
for f in $L/q35-*.log; do echo "$(basename $f): $(grep '"what":"prefill"' $f | sed 's/.*"algo":"\([A-Za-z0-9]*\)".*"ms":\([0-9.]*\).*/\1 \2/' | tr '\n' ' ')"; done
for f in $L/gdn-*.log; do echo "$(basename $f): $(grep '^prefill B=1, T=4096' $f | sed 's/  */ /g' | cut -c1-110 | tr '\n' '|')"; done
[ $SECONDS -gt 380 ] && { echo "no time for the profile"; cd $OUT && tar czf logs.tgz logs && rm -rf logs; exit 0; }
s=$(date +%s)
timeout 150 bash benches/hybrid_profile.sh --prefill /tmp/n/gpu_bench /tmp/q35 $L/q35prof > $L/q35prof.out 2>&1
echo "q35 profile rc=$? $(( $(date +%s) - s )) s"; sed -n 1,30p $L/q35prof/kernels-prefill.md | grep -E 'kernels|prep|conv|gated|norm|chunk|Step'
cd $OUT && tar czf logs.tgz logs && rm -rf logs

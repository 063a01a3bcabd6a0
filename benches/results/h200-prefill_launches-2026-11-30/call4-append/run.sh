#!/bin/bash
# Session 17, call 4: the whole GPU suite on the final build (only the warp-per-head append
# changed from HEAD; the one-launch conv + prep and the tile kernel's gated output reverted);
# the Qwen3.5 prefill's kernels under Nsight Compute, HEAD's build and this one in the same call;
# prefill timings alternating, three rounds.
mkdir -p /tmp/n /tmp/b && tar -C /tmp/n -xJf .devbuild/c4.tar.xz && tar -C /tmp/b -xJf .devbuild/b1.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run34.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $L/gpu.txt
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests $T > $L/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|fused kernel bit" $L/tests.log | tail -4
s=$(date +%s)
python3 -c "import sys; sys.path.insert(0, 'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/q35build.log 2>&1
echo "q35 build rc=$? $(( $(date +%s) - s )) s"
for r in 1 2 3; do
  for v in b n; do
    bin=/tmp/n/gpu_bench; [ $v = b ] && bin=/tmp/b/gpu_bench
    timeout 60 $bin --hybrid-dir /tmp/q35 --batches 1 --reps 5 > $L/q35-$r-$v.log 2>&1
    echo "$r $v: $(grep '"what":"prefill"' $L/q35-$r-$v.log | sed 's/.*"algo":"\([A-Za-z0-9]*\)".*"ms":\([0-9.]*\).*/\1 \2/' | tr '\n' ' ') $(( $(date +%s) - s )) s"
  done
done
for v in b n; do
  bash benches/hybrid_profile.sh --prefill /tmp/$v/gpu_bench /tmp/q35 $L/q35prof-$v > $L/q35prof-$v.out 2>&1
  echo "profile $v rc=$? $(( $(date +%s) - s )) s"
done
for v in b n; do echo "== $v"; sed -n 1p $L/q35prof-$v/kernels-prefill.md; grep -E 'attn_append|Step replayed' $L/q35prof-$v/kernels-prefill.md; done
gzip -9 $L/q35prof-*/ncu-prefill.csv
cd $OUT && tar czf logs.tgz logs && rm -rf logs

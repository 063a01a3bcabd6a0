#!/bin/bash
# Session 17, call 2: the whole GPU suite on the final build (the tile kernel's typed, gated
# output new, with its bit-for-bit comparison in gpu_paged_attention_matches_cpu); the Qwen3.5
# layout's prefill: HEAD's build (b), this build (n), n with the conv + prep in two launches
# (c0), n with the tile kernel's fp32 rows gated after (t0), alternating, three rounds; the
# 1.39B's (b, n), two rounds; the Qwen3.5 prefill's kernels under Nsight Compute (n).
mkdir -p /tmp/n /tmp/b && tar -C /tmp/n -xJf .devbuild/c2.tar.xz && tar -C /tmp/b -xJf .devbuild/b1.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run32.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $L/gpu.txt
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests $T > $L/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|typed|conv \+ prep" $L/tests.log | tail -9
s=$(date +%s)
python3 -c "import sys; sys.path.insert(0, 'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/q35build.log 2>&1
echo "q35 build rc=$? $(( $(date +%s) - s )) s"
for r in 1 2 3; do
  for v in b n c0 t0; do
    bin=/tmp/n/gpu_bench; [ $v = b ] && bin=/tmp/b/gpu_bench
    cp=1; [ $v = c0 ] && cp=0; ty=1; [ $v = t0 ] && ty=0
    DELTASERVE_CONV_PREP=$cp DELTASERVE_ATTN_TYPED_OUT=$ty timeout 60 $bin --hybrid-dir /tmp/q35 --batches 1 --reps 5 > $L/q35-$r-$v.log 2>&1
    echo "$r $v: $(grep '"what":"prefill"' $L/q35-$r-$v.log | sed 's/.*"algo":"\([A-Za-z0-9]*\)".*"ms":\([0-9.]*\).*/\1 \2/' | tr '\n' ' ') $(( $(date +%s) - s )) s"
  done
done
for r in 1 2; do
  for v in b n; do
    bin=/tmp/n/gpu_bench; [ $v = b ] && bin=/tmp/b/gpu_bench
    timeout 100 $bin --model-only --reps 3 > $L/gdn-$r-$v.log 2>&1
    echo "gdn $r $v: $(grep '^prefill B=1, T=4096' $L/gdn-$r-$v.log | sed 's/  */ /g' | cut -c1-90 | tr '\n' '|') $(( $(date +%s) - s )) s"
  done
done
bash benches/hybrid_profile.sh --prefill /tmp/n/gpu_bench /tmp/q35 $L/q35prof > $L/q35prof.out 2>&1
echo "profile rc=$? $(( $(date +%s) - s )) s"; head -40 $L/q35prof/kernels-prefill.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

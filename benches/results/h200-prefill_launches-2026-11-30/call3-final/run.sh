#!/bin/bash
# Session 17, call 3: the whole GPU suite on the final build (the conv + prep epilogue and the
# tile kernel's gated epilogue with their loads side by side); the Qwen3.5 prefill's kernels
# under Nsight Compute with everything on and with the two switched off (conv + prep in two
# launches, fp32 tile rows gated after); prefill timings alternating: HEAD's build (b), this
# build (n), n with both off (o0), three rounds; the 1.39B's (b, n), three rounds.
mkdir -p /tmp/n /tmp/b && tar -C /tmp/n -xJf .devbuild/c3.tar.xz && tar -C /tmp/b -xJf .devbuild/b1.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run33.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $L/gpu.txt
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests $T > $L/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|typed|conv \+ prep" $L/tests.log | tail -9
s=$(date +%s)
python3 -c "import sys; sys.path.insert(0, 'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/q35build.log 2>&1
echo "q35 build rc=$? $(( $(date +%s) - s )) s"
for r in 1 2 3; do
  for v in b n o0; do
    bin=/tmp/n/gpu_bench; [ $v = b ] && bin=/tmp/b/gpu_bench; on=1; [ $v = o0 ] && on=0
    DELTASERVE_CONV_PREP=$on DELTASERVE_ATTN_TYPED_OUT=$on timeout 60 $bin --hybrid-dir /tmp/q35 --batches 1 --reps 5 > $L/q35-$r-$v.log 2>&1
    echo "$r $v: $(grep '"what":"prefill"' $L/q35-$r-$v.log | sed 's/.*"algo":"\([A-Za-z0-9]*\)".*"ms":\([0-9.]*\).*/\1 \2/' | tr '\n' ' ') $(( $(date +%s) - s )) s"
  done
  for v in b n; do
    bin=/tmp/n/gpu_bench; [ $v = b ] && bin=/tmp/b/gpu_bench
    timeout 100 $bin --model-only --reps 3 > $L/gdn-$r-$v.log 2>&1
    echo "gdn $r $v: $(grep '^prefill B=1, T=4096' $L/gdn-$r-$v.log | sed 's/.*(\(.*\) mixer.*: \([0-9.]*\) ms.*/\1 \2/' | tr '\n' ' ') $(( $(date +%s) - s )) s"
  done
done
bash benches/hybrid_profile.sh --prefill /tmp/n/gpu_bench /tmp/q35 $L/q35prof > $L/q35prof.out 2>&1
echo "profile rc=$? $(( $(date +%s) - s )) s"
DELTASERVE_CONV_PREP=0 DELTASERVE_ATTN_TYPED_OUT=0 bash benches/hybrid_profile.sh --prefill /tmp/n/gpu_bench /tmp/q35 $L/q35prof-off > $L/q35prof-off.out 2>&1
echo "profile off rc=$? $(( $(date +%s) - s )) s"
for d in q35prof q35prof-off; do echo "== $d"; sed -n 1,3p $L/$d/kernels-prefill.md; grep -E 'conv_prefill|prep_bf16_narrow|attn_tiles|attn_append|sigmoid_gate|Step replayed' $L/$d/kernels-prefill.md; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

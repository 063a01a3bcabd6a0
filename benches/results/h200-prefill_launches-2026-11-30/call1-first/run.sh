#!/bin/bash
# Session 17, call 1: the one-launch conv + prep and the warp-per-head append. Their tests and the
# ones that run them (bit for bit against the two launches, the fused decode attention against
# the append), then the Qwen3.5 layout's prefill: HEAD's build (b), this build (n), this build
# with the conv + prep in two launches (n, DELTASERVE_CONV_PREP=0), alternating, two rounds;
# then the rest of the GPU suite.
mkdir -p /tmp/n /tmp/b && tar -C /tmp/n -xJf .devbuild/c1.tar.xz && tar -C /tmp/b -xJf .devbuild/b1.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run31.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $L/gpu.txt
FIRST="gpu_conv_prep_one_launch_equals_two gpu_paged_attention_matches_cpu gpu_models_match_cpu_and_goldens gpu_packed_prefill_equals_prefilling_each_alone gpu_prefix_cache_snapshots_match_whole_prefills"
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests $FIRST > $L/tests1.log 2>&1
echo "tests1 rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|test result|conv \+ prep|passes" $L/tests1.log | tail -12
s=$(date +%s)
python3 -c "import sys; sys.path.insert(0, 'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/q35build.log 2>&1
echo "q35 build rc=$? $(( $(date +%s) - s )) s"
for r in 1 2; do
  for v in b n n0; do
    bin=/tmp/n/gpu_bench; [ $v = b ] && bin=/tmp/b/gpu_bench; cp=1; [ $v = n0 ] && cp=0
    DELTASERVE_CONV_PREP=$cp timeout 60 $bin --hybrid-dir /tmp/q35 --batches 1 --reps 3 > $L/q35-$r-$v.log 2>&1
    echo "$r $v: $(grep '"what":"prefill"' $L/q35-$r-$v.log | sed 's/.*"algo":"\([A-Za-z0-9]*\)".*"ms":\([0-9.]*\).*/\1 \2/' | tr '\n' ' ') $(( $(date +%s) - s )) s"
  done
done
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
REST=$(for t in $T; do echo "$FIRST" | grep -qw $t || echo $t; done)
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $REST > $L/tests2.log 2>&1
echo "tests2 rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|test result" $L/tests2.log | tail -4
cd $OUT && tar czf logs.tgz logs && rm -rf logs

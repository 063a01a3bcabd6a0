#!/usr/bin/env bash
# The MoE routing a warp a token (b162; a block a token before): the MoE op test and the GPU
# suite; the MoE model (Qwen3.5-35B-A3B's layer shapes, 8 layers, transformers' init) written
# without timing transformers; the previous commit's build (base) against this one, prefill and
# decode at 1 / 16 / 64, alternating, two rounds; the batch-1 decode step by kernel.
L=$OUT/logs; mkdir -p $L /tmp/n; cp .devbuild/run162.sh $L/run.sh
tar -C /tmp/n -xJf .devbuild/b162.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
DELTASERVE_TESTS_DIR=$PWD/tests timeout 120 /tmp/n/gpu_tests gpu_sparse_moe_matches_cpu --nocapture > $L/moe_test.log 2>&1; echo "moe test rc $? at ${SECONDS}s"
grep -a "N=5 I=96 BF16\|N=600 I=192 BF16\|GEMVs\|FAILED\|panicked\|GPU tests:" $L/moe_test.log | head -12
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:\|test result" $L/gpu_tests.log | head -10
M=/tmp/deltaserve-qwen3_5_moe
timeout 150 python3 -c "import sys; sys.path.insert(0, 'benches'); import hybrid_vs_hf as h; h.build_moe('$M')" > $L/build_moe.log 2>&1; echo "model rc $? at ${SECONDS}s"
for round in 1 2; do
  for v in base new; do
    B=/tmp/n/gpu_bench; [ $v = base ] && B=/tmp/n/gpu_bench_base
    timeout 60 $B --hybrid-dir $M --batches 1,16,64 --reps 10 > $L/ab-$v-$round.log 2>&1
    echo "$v $round: $(grep '^OURS' $L/ab-$v-$round.log | python3 -c 'import sys, json
rs = [json.loads(l[5:]) for l in sys.stdin]
print(" ".join(("%s %.2f" % (r["algo"], r["ms"])) if r["what"] == "prefill" else ("b%d %.3f (%.0f%%)" % (r["batch"], r["ms"], 100 * r["roofline_ms"] / r["ms"])) for r in rs if r["what"] in ("prefill", "decode")))')"
  done
done
[ $SECONDS -lt 330 ] && { timeout 80 bash benches/hybrid_profile.sh /tmp/n/gpu_bench $M $L/prof_decode > $L/prof_decode.log 2>&1; echo "prof decode rc $? at ${SECONDS}s"; grep 'moe_\|^###' $L/prof_decode/kernels-b1.md | head -8; }
cd $OUT && tar czf logs.tgz logs && rm -rf logs

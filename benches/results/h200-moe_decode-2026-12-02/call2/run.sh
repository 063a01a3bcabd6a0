#!/usr/bin/env bash
# A decode step's MoE GEMVs with W's next K step in flight and four rows a pass, the down
# projection four columns a warp, the combine spread over column blocks (b160): the MoE op test
# and the GPU suite; the Qwen3.5-35B-A3B-layout MoE (8 layers) against transformers 5.17 + fla
# 0.6.0 in one run; the previous commit's build (base: the sort spread over blocks) against this
# one, prefill and decode at 1 / 16 / 64, alternating, two rounds; the decode steps under Nsight
# Compute by kernel.
L=$OUT/logs; mkdir -p $L /tmp/n; cp .devbuild/run160.sh $L/run.sh
tar -C /tmp/n -xJf .devbuild/b160.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
DELTASERVE_TESTS_DIR=$PWD/tests timeout 120 /tmp/n/gpu_tests gpu_sparse_moe_matches_cpu --nocapture > $L/moe_test.log 2>&1; echo "moe test rc $? at ${SECONDS}s"
grep -a "N=1 \|N=5 \|N=600\|GEMVs\|FAILED\|panicked\|GPU tests:" $L/moe_test.log | head -20
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:\|test result" $L/gpu_tests.log | head -10
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl > $L/pip.log 2>&1
M=/tmp/deltaserve-qwen3_5_moe
PYTHONPATH=$FLA timeout 300 python3 benches/hybrid_vs_hf.py --moe --bench-bin /tmp/n/gpu_bench --reps 10 > $L/moe_vs_hf.log 2>&1
echo "moe_vs_hf rc $? at ${SECONDS}s"; grep "^|\|^##" $L/moe_vs_hf.log | tail -9
for round in 1 2; do
  for v in base new; do
    B=/tmp/n/gpu_bench; [ $v = base ] && B=/tmp/n/gpu_bench_base
    timeout 90 $B --hybrid-dir $M --batches 1,16,64 --reps 10 > $L/ab-$v-$round.log 2>&1
    echo "$v $round: $(grep '^OURS' $L/ab-$v-$round.log | python3 -c 'import sys, json
rs = [json.loads(l[5:]) for l in sys.stdin]
print(" ".join(("%s %.2f" % (r["algo"], r["ms"])) if r["what"] == "prefill" else ("b%d %.3f (%.0f%%)" % (r["batch"], r["ms"], 100 * r["roofline_ms"] / r["ms"])) for r in rs if r["what"] in ("prefill", "decode")))')"
  done
done
[ $SECONDS -lt 480 ] && { timeout 110 bash benches/hybrid_profile.sh /tmp/n/gpu_bench $M $L/prof_decode > $L/prof_decode.log 2>&1; echo "prof decode rc $? at ${SECONDS}s"; grep 'moe_\|^###' $L/prof_decode/kernels-*.md | head -20; }
cd $OUT && tar czf logs.tgz logs && rm -rf logs

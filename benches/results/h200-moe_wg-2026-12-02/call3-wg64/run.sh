#!/usr/bin/env bash
# The MoE block's prompt projections on the warpgroup tensor cores (b156): the GPU suite; the
# Qwen3.5-35B-A3B-layout MoE (8 layers) against transformers 5.17 + fla 0.6.0 in one run; the
# wmma tiles (DELTASERVE_MOE_WG=0) against the warpgroup tiles, alternating, two rounds; the new
# prefill under Nsight Compute by kernel.
L=$OUT/logs; mkdir -p $L /tmp/n; cp .devbuild/run156.sh $L/run.sh
tar -C /tmp/n -xJf .devbuild/b156.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
DELTASERVE_TESTS_DIR=$PWD/tests timeout 120 /tmp/n/gpu_tests gpu_sparse_moe_matches_cpu --nocapture > $L/moe_test.log 2>&1; echo "moe test rc $? at ${SECONDS}s"
grep -a "sparse MoE N=300\|warpgroup vs\|FAILED\|panicked\|GPU tests:" $L/moe_test.log | head -20
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:\|test result" $L/gpu_tests.log | head -10
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl > $L/pip.log 2>&1
M=/tmp/deltaserve-qwen3_5_moe
PYTHONPATH=$FLA timeout 300 python3 benches/hybrid_vs_hf.py --moe --bench-bin /tmp/n/gpu_bench --reps 10 > $L/moe_vs_hf.log 2>&1
echo "moe_vs_hf rc $? at ${SECONDS}s"; grep "^|\|^##" $L/moe_vs_hf.log | tail -9
for round in 1 2; do
  for v in wmma wg; do
    if [ $v = wmma ]; then export DELTASERVE_MOE_WG=0; else unset DELTASERVE_MOE_WG; fi
    timeout 90 /tmp/n/gpu_bench --hybrid-dir $M --batches 1 --reps 10 > $L/ab-$v-$round.log 2>&1
    echo "$v $round: $(grep '^OURS' $L/ab-$v-$round.log | grep prefill | python3 -c 'import sys, json; print(" ".join("%s %.2f ms" % (json.loads(l[5:])["algo"], json.loads(l[5:])["ms"]) for l in sys.stdin))')"
  done
done
unset DELTASERVE_MOE_WG
timeout 200 bash benches/hybrid_profile.sh --prefill /tmp/n/gpu_bench $M $L/prof > $L/prof.log 2>&1
echo "prof rc $? at ${SECONDS}s"; head -24 $L/prof/kernels-prefill.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

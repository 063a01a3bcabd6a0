#!/usr/bin/env bash
# The last block at the logits' rows and the near-fp32 prep reading v in place: the GPU suite,
# T=4096 prefills of the 1.39B and the Qwen3.5 layout with both off, the cut alone, and both on,
# alternating, two rounds; then transformers 5.17 + fla 0.6.0 on both models in the same call.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t99.tar.xz; tar -C /tmp/n -xJf .devbuild/b99.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -c "^test .* ok$" $L/gpu_tests.log; grep -a "FAILED\|panicked\|GPU tests:" $L/gpu_tests.log | head -20
grep -a "GPU f32 vs CPU" $L/gpu_tests.log | head -12
MODELS="gdn q35" PREFILL=1 ROUNDS=2 BATCHES=1 TIMEOUT=80 timeout 300 bash benches/ab_decode.sh $L/ab \
  "off=DELTASERVE_LAST_ROWS=0 DELTASERVE_F32_V_IN_PLACE=0 /tmp/n/gpu_bench" "rows=DELTASERVE_F32_V_IN_PLACE=0 /tmp/n/gpu_bench" "new=/tmp/n/gpu_bench" > $L/ab.log 2>&1; echo "ab rc $? at ${SECONDS}s"
cat $L/ab/summary.md
FLA=$(mktemp -d); pip install --quiet --no-deps --no-index --target "$FLA" .whl/*.whl 2>/dev/null
PYTHONPATH=$FLA timeout 150 python3 benches/fla_prefill.py /tmp/deltaserve-gdn-1.3b $L/fla_prefill.json 4096 20 > $L/fla_prefill.log 2>&1; echo "fla_prefill rc $? at ${SECONDS}s"; tail -2 $L/fla_prefill.log
PYTHONPATH=$FLA timeout $((575 - SECONDS)) python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1; echo "hybrid rc $? at ${SECONDS}s"; tail -9 $L/hybrid_vs_hf.log
timeout $((590 - SECONDS)) /tmp/n/gpu_bench --model-only --batches 1 --graphs-only > $L/gdn-after.md 2>&1; grep -i '^prefill' $L/gdn-after.md
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

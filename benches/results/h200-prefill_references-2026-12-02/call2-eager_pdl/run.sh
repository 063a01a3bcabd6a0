#!/usr/bin/env bash
# Eager launches made programmatic (b143; DELTASERVE_EAGER_PDL=0 gives the plain launches of
# before): the GPU suite; T=4096 prefills and decode steps at batch 1, 16 and 64, plain against
# programmatic, alternating, two rounds, both models; each model's prefill host enqueue, eager
# wall, and (the 1.39B) the same pass replayed from a CUDA graph.
L=$OUT/logs; mkdir -p $L /tmp/n; cp .devbuild/run144.sh $L/run.sh
tar -C /tmp/n -xJf .devbuild/b143.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 240 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:\|eager PDL" $L/gpu_tests.log | head -40
PREFILL=1 MODELS="q35 gdn" ROUNDS=2 BATCHES=1,16,64 TIMEOUT=100 MODEL_DIR=/tmp/gdn timeout 330 bash benches/ab_decode.sh $L/ab \
  "plain=DELTASERVE_EAGER_PDL=0 /tmp/n/gpu_bench" "pdl=/tmp/n/gpu_bench" > $L/ab.log 2>&1; echo "ab rc $? at ${SECONDS}s"
cat $L/ab/summary.md
for v in 0 1; do
  DELTASERVE_EAGER_PDL=$v timeout 60 /tmp/n/gpu_bench --model-only --model-dir /tmp/gdn --prefill-graph --batches 1 --reps 5 > $L/gdn_graph_$v.log 2>&1
  grep prefill_graph $L/gdn_graph_$v.log | sed "s/^/pdl=$v gdn /"
  DELTASERVE_EAGER_PDL=$v timeout 60 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --prefill-graph --batches 1 --reps 5 > $L/q35_graph_$v.log 2>&1
  grep prefill_graph $L/q35_graph_$v.log | sed "s/^/pdl=$v q35 /"
done
echo "done at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# Hybrids' prefill and mixed passes as CUDA graphs (b147): the GPU suite (the graph tests now take
# the dense hybrids); on the Qwen3.5 layout (transformers' own init), short prefills and mixed
# passes eager against replayed from graphs, and the T=4096 prefill's enqueue / eager / graph.
L=$OUT/logs; mkdir -p $L /tmp/n; cp .devbuild/run147.sh $L/run.sh
tar -C /tmp/n -xJf .devbuild/b147.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 330 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:\|graph" $L/gpu_tests.log | head -60
python3 -c "import sys; sys.path.insert(0, 'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/q35_build.log 2>&1; echo "q35 build rc $? at ${SECONDS}s"
timeout 100 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --mixed-passes --reps 10 > $L/q35_mixed.md 2>&1; echo "mixed rc $? at ${SECONDS}s"
grep "|" $L/q35_mixed.md; tail -3 $L/q35_mixed.md
timeout 60 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --prefill-graphs --reps 10 > $L/q35_short.md 2>&1; echo "short rc $? at ${SECONDS}s"
grep "|" $L/q35_short.md; tail -3 $L/q35_short.md
timeout 60 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --prefill-graph --batches 1 --reps 5 > $L/q35_graph.log 2>&1; echo "graph rc $? at ${SECONDS}s"
grep "prefill" $L/q35_graph.log; tail -3 $L/q35_graph.log
echo "done at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

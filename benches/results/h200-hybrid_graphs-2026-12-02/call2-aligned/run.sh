#!/usr/bin/env bash
# Hybrids' prefill and mixed passes as CUDA graphs (b148: tile lists 16-byte aligned, random hd 64 /
# 128 hybrids in the graph tests, a captured pass's two-warpgroup state pass decided by its rows):
# the GPU suite; on the Qwen3.5 layout (transformers' own init) mixed passes and short prefills,
# eager against graph, and the T=4096 prefill's enqueue / eager / graph; then served (the same
# layout, vocabulary 4,096, random bf16), prefill and mixed graphs off against on, at 64 streams.
L=$OUT/logs; mkdir -p $L /tmp/n; cp .devbuild/run148.sh $L/run.sh
tar -C /tmp/n -xJf .devbuild/b148.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 330 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; rc=$?; echo "gpu tests rc $rc at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:\|random/\|cases ×" $L/gpu_tests.log | head -60
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0, 'benches'); import hybrid_vs_hf as h; h.build('/tmp/q35')" > $L/q35_build.log 2>&1
timeout 120 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --mixed-passes --reps 10 > $L/q35_mixed.md 2>&1; echo "mixed rc $? at ${SECONDS}s"
grep "|" $L/q35_mixed.md; grep -m3 "Error\|error" $L/q35_mixed.md
timeout 60 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --prefill-graphs --reps 10 > $L/q35_short.md 2>&1; echo "short rc $? at ${SECONDS}s"
grep "|" $L/q35_short.md
timeout 60 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --prefill-graph --batches 1 --reps 5 > $L/q35_graph.log 2>&1; echo "graph rc $? at ${SECONDS}s"
grep "prefill_graph" $L/q35_graph.log
[ $rc = 0 ] || exit 1
M=/tmp/q35-v4096
[ -f $M/config.json ] || /tmp/n/deltaserve init-random --config benches/configs/qwen3.5-2b-v4096.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
echo "init at ${SECONDS}s"; tail -1 $L/init.log
printf '#!/bin/sh\nexec /tmp/n/deltaserve "$@" --prefill-graph-tokens 0 --mixed-graph-tokens 0\n' > /tmp/n/graphs_off; chmod +x /tmp/n/graphs_off
C=64 ROUNDS=1 MODEL=$M READY_SECS=200 timeout 330 bash benches/ab_serving.sh /tmp/n/graphs_off /tmp/n/deltaserve /tmp/n/serve_bench $L/served > $L/served.log 2>&1
echo "served rc $? at ${SECONDS}s"; cat $L/served/ab.md; tail -5 $L/served.log
grep -h "warm-up\|warm_up\|graph shapes" $L/served/serve-*.log | head -6
echo "done at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

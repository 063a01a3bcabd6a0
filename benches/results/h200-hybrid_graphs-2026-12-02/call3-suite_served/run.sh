#!/usr/bin/env bash
# Hybrids' prefill and mixed passes as CUDA graphs (b149 = b148's engine; the graph tests' random
# hybrids now fla attention layers at head dims 128 and 64, written by init-random): the GPU suite;
# then served, the Qwen3.5-2B layout (transformers' own init, vocabulary 4,096, the demo
# tokenizer), prefill and mixed graphs off against on, 64 streams of 512-token prompts and
# 256-token outputs, alternating, two rounds.
L=$OUT/logs; mkdir -p $L /tmp/n; cp .devbuild/run149.sh $L/run.sh
tar -C /tmp/n -xJf .devbuild/b149.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; rc=$?; echo "gpu tests rc $rc at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:\|random/" $L/gpu_tests.log | head -30
[ $rc = 0 ] || exit 1
M=/tmp/q35-v4096
python3 -c "import sys; sys.path.insert(0, 'benches'); import hybrid_vs_hf as h; h.build('$M', vocab_size=4096, eos_token_id=2)" > $L/q35_build.log 2>&1
cp models/gdn-demo/tokenizer.json models/gdn-demo/tokenizer_config.json $M/
echo "model at ${SECONDS}s"; ls $M
printf '#!/bin/sh\nexec /tmp/n/deltaserve "$@" --prefill-graph-tokens 0 --mixed-graph-tokens 0\n' > /tmp/n/graphs_off; chmod +x /tmp/n/graphs_off
C=64 ROUNDS=2 MODEL=$M READY_SECS=200 timeout 360 bash benches/ab_serving.sh /tmp/n/graphs_off /tmp/n/deltaserve /tmp/n/serve_bench $L/served > $L/served.log 2>&1
echo "served rc $? at ${SECONDS}s"; cat $L/served/ab.md; tail -3 $L/served.log
grep -h "warm-up\|warmed\|graph_shapes" $L/served/serve-*.log | head -4
echo "done at ${SECONDS}s"

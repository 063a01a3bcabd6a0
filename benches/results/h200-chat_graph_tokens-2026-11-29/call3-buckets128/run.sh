#!/bin/bash
# Call 7: graph buckets past 512 rows in steps of 128. The GPU suite (mixed graphs up to 1,024
# prompt tokens in its mixed-pass test), then the chat workload (8 conversations, 8 turns) with
# the cache and mixed graphs up to 512 (the default) or 1,024 prompt tokens, and without the
# cache; two rounds, alternating.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run7.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 220 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests:" $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -20
grep -E "mixed cases" $L/gpu_tests.log | head -8
export FLAGS_m1024="--prefix-cache-memory 0.3 --mixed-graph-tokens 1024"
MODEL=/tmp/chat-1.3b ROUNDS=2 CONVS="8" TURNS=8 MODES="cache m1024 nocache" timeout 330 bash benches/prefix_cache_chat.sh /tmp/b/loadgen $L/chat deltaserve=/tmp/b/deltaserve > $L/chat.log 2>&1
echo "chat rc=$?"; grep -E "^## |turns 2" $L/chat/chat.md
rm -f $L/chat/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

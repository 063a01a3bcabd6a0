#!/bin/bash
# Call 4: the whole GPU suite on the final build; the chat workload as issue 20 states it (5
# turns, 1 and 8 conversations) with a 0.5–1.5 s pause before each turn, cached and uncached.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run4.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 330 /tmp/n/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests:" $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -20
s=$(date +%s)
MODEL=/tmp/chat-1.3b THINK_MS=1000 ROUNDS=2 CONVS="1 8" TURNS=5 timeout 220 bash benches/prefix_cache_chat.sh /tmp/n/loadgen $L/chat deltaserve=/tmp/n/deltaserve > $L/chat.log 2>&1
echo "chat rc=$? $(( $(date +%s) - s )) s"; grep -E "^## |turns 2" $L/chat/chat.md
rm -f $L/chat/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

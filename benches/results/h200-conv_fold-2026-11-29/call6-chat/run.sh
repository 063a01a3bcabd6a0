#!/bin/bash
# Call 6: the chat workload (8 conversations, 8 turns, two rounds) with the prefix cache and
# without, on this build (7e2efdb: decode steps ahead, the short conv folded).
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/chat.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run6.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
MODEL=/tmp/chat-1.3b ROUNDS=2 CONVS="8" TURNS=8 timeout 280 bash benches/prefix_cache_chat.sh /tmp/b/loadgen $L/chat deltaserve=/tmp/b/deltaserve > $L/chat.log 2>&1
echo "chat rc=$?"; grep -E "^## |turns 2" $L/chat/chat.md
rm -f $L/chat/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

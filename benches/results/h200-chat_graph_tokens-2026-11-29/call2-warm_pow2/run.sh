#!/bin/bash
# Call 6: the chat workload (8 conversations, 8 turns) on a server warmed with the same workload's
# other conversations first (WARM=1: its mixed-pass graphs captured, as on a server that has run
# a while): the prefix cache, the cache with mixed graphs up to 1,024 prompt tokens, and no cache;
# two rounds, alternating.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run6.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
export FLAGS_m1024="--prefix-cache-memory 0.3 --mixed-graph-tokens 1024"
WARM=1 MODEL=/tmp/chat-1.3b ROUNDS=2 CONVS="8" TURNS=8 MODES="cache m1024 nocache" timeout 560 bash benches/prefix_cache_chat.sh /tmp/b/loadgen $L/chat deltaserve=/tmp/b/deltaserve > $L/chat.log 2>&1
echo "chat rc=$?"; grep -E "^## |turns 2" $L/chat/chat.md
rm -f $L/chat/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

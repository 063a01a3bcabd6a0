#!/bin/bash
# Call 1 (2026-11-29, third session): the chat workload (8 conversations, 8 turns), the prefix
# cache with prefill graphs up to 256 (default), 512 and 1024 tokens, and without the cache; two
# rounds, alternating. One more cached round with the scheduler's trace.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run1.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
printf '#!/bin/sh\nDELTASERVE_LOG=deltaserve::scheduler=trace,info exec /tmp/b/deltaserve "$@"\n' > /tmp/b/traced
chmod +x /tmp/b/traced
export FLAGS_g512="--prefix-cache-memory 0.3 --prefill-graph-tokens 512"
export FLAGS_g1024="--prefix-cache-memory 0.3 --prefill-graph-tokens 1024"
MODEL=/tmp/chat-1.3b ROUNDS=2 CONVS="8" TURNS=8 MODES="cache g512 g1024 nocache" timeout 420 bash benches/prefix_cache_chat.sh /tmp/b/loadgen $L/chat deltaserve=/tmp/b/deltaserve > $L/chat.log 2>&1
echo "chat rc=$?"; grep -E "^## |turns 2" $L/chat/chat.md
rm -f $L/chat/serve-*.log
MODEL=/tmp/chat-1.3b ROUNDS=1 CONVS="8" TURNS=8 MODES="cache" timeout 100 bash benches/prefix_cache_chat.sh /tmp/b/loadgen $L/trace traced=/tmp/b/traced > $L/trace.log 2>&1
echo "trace rc=$?"; grep -E "^## |turns 2" $L/trace/chat.md
xz -9 $L/trace/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 5: the chat workload's uncached turns (8 conversations, 8 turns) with and without
# `--decode-ahead`, the engine's step trace kept (DELTASERVE_LOG), one round each.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz && xz -dc .devbuild/loadgen.xz > /tmp/b/loadgen && chmod +x /tmp/b/loadgen
L=$OUT/logs; mkdir -p $L; cp .devbuild/run5.sh $L/run.sh
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --decode-ahead\n' > /tmp/b/ahead; chmod +x /tmp/b/ahead
export DELTASERVE_LOG="info,deltaserve=trace"
MODES="nocache" MODEL=/tmp/chat-1.3b ROUNDS=2 CONVS="8" TURNS=8 timeout 200 bash benches/prefix_cache_chat.sh /tmp/b/loadgen $L/chat plain=/tmp/b/deltaserve ahead=/tmp/b/ahead > $L/chat.log 2>&1
echo "chat rc=$?"; grep -E "^## |turns 2" $L/chat/chat.md
ls -la $L/chat; gzip -9 $L/chat/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Call 5: issue 20's second goal on the H200: decode throughput when every request misses the
# prefix cache (32 clients, distinct 512-token prompts, 128 tokens each, 256 requests), the
# server with the cache (default) and with --no-prefix-cache, three rounds alternating.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run5.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
M=/tmp/deltaserve-gdn-1.3b
/tmp/n/deltaserve init-random --config benches/configs/gdn-1.3b.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
source scripts/serve-common.sh
port=18900
for round in 1 2 3; do
  for mode in cache nocache; do
    port=$((port + 1))
    flags=(); [ $mode = nocache ] && flags=(--no-prefix-cache)
    start_server /tmp/n/deltaserve $port $L/serve-$mode-$round.log --model $M --device cuda --dtype bf16 "${flags[@]}"
    pid=$server_pid
    /tmp/n/loadgen --url http://127.0.0.1:$port --clients 4 --requests 8 --prompt-tokens 512 --max-tokens 16 --distinct > /dev/null
    echo "## $mode, round $round" >> $L/misses.md
    /tmp/n/loadgen --url http://127.0.0.1:$port --clients 32 --requests 256 --prompt-tokens 512 --max-tokens 128 --distinct --temperature 0 >> $L/misses.md
    python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode())" |
      grep -E '^deltaserve:prefix_cache_(hits|queries)_total' >> $L/misses.md || true
    kill $pid; wait $pid 2>/dev/null
  done
done
cat $L/misses.md
rm -f $L/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

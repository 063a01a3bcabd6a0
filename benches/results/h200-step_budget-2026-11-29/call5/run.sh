#!/bin/bash
# Call 8: warm-up time at --max-num-batched-tokens 1024 with mixed graphs to 512 (the old
# default) and to 1024 (the new), and at the default budget; the 1.39B, --max-num-seqs 256.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run8.sh $L/run.sh
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $M/config.json ] || /tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
source scripts/serve-common.sh
port=18900
for cfg in "512" "1024 --mixed-graph-tokens 512" "1024" "1024 --mixed-graph-tokens 512" "1024"; do
  port=$((port + 1))
  start_server /tmp/b/deltaserve $port $L/serve-$port.log --model $M --device cuda --dtype bf16 --max-num-seqs 256 --max-model-len 4096 --max-queue 4096 --max-num-batched-tokens $cfg
  kill $server_pid; wait $server_pid 2>/dev/null
  echo "budget $cfg: $(grep -h 'warmed up' $L/serve-$port.log | sed 's/\x1b\[[0-9;]*m//g' | grep -o 'prefill_passes=.*')"
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

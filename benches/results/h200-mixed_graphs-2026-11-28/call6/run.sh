#!/bin/bash
# Device call 6: GPU memory held by a ready server (warm-up done) with 64 decode graphs kept
# (`prev`, the build before) and with every batch size's kept (`this`), --max-num-seqs 256.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/bins.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run6.sh $L/run.sh
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
/tmp/b/deltaserve-this init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
source scripts/serve-common.sh
for b in prev this prev this; do
  start_server /tmp/b/deltaserve-$b 18950 $L/serve-$b.log --model $M --device cuda --dtype bf16 --max-num-seqs 256 --max-model-len 4096
  sleep 1
  echo "$b $(nvidia-smi --query-gpu=memory.used --format=csv,noheader) $(grep -h 'warmed up' $L/serve-$b.log | sed 's/\x1b\[[0-9;]*m//g' | grep -o 'decode_batch_sizes.*')"
  grep -h "state pool\|slots" $L/serve-$b.log | sed 's/\x1b\[[0-9;]*m//g' | head -2
  kill $server_pid; wait $server_pid 2>/dev/null; sleep 2
done | tee $L/memory.txt
cd $OUT && tar czf logs.tgz logs && rm -rf logs

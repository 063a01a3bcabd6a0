#!/bin/bash
# Session 18, call 9: candle's kernel modules compiled by the driver ahead, on a thread each,
# while the weights are read. Fresh machine, the 1.39B (vocabulary 4,096), each start with its
# own empty driver cache (CUDA_CACHE_PATH): ahead off, ahead on, off, on; then a start with a
# warm cache.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/k11.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run47.sh $L/run.sh
M=/tmp/gdn-v4096
python3 -c "import json; c = json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size'] = 4096; json.dump(c, open('/tmp/cfg.json', 'w'))"
/tmp/n/deltaserve init-random --config /tmp/cfg.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1; echo "init rc=$?"
cat $M/*.safetensors > /dev/null
run() {  # name, env...
  f=$L/$1.log; shift
  s=$(date +%s.%N)
  env "$@" /tmp/n/deltaserve serve --model $M --device cuda --dtype bf16 --port 18600 > $f 2>&1 &
  pid=$!
  for _ in $(seq 1 1200); do grep -q 'warmed up\|warm-up failed\|Error' $f && break; sleep 0.05; done
  e=$(date +%s.%N); kill -TERM $pid; wait $pid
  echo "$(basename $f .log): start to warmed $(python3 -c "print(round($e - $s, 2))") s; $(sed 's/\x1b\[[0-9;]*m//g' $f | grep -o 'secs=[0-9.]*' | head -1)"
}
run off-1 CUDA_CACHE_PATH=/tmp/c1 DELTASERVE_JIT_AHEAD=0
run on-1 CUDA_CACHE_PATH=/tmp/c2
run off-2 CUDA_CACHE_PATH=/tmp/c3 DELTASERVE_JIT_AHEAD=0
run on-2 CUDA_CACHE_PATH=/tmp/c4
run on-warm CUDA_CACHE_PATH=/tmp/c4
run off-warm CUDA_CACHE_PATH=/tmp/c3 DELTASERVE_JIT_AHEAD=0
du -sh /tmp/c1 /tmp/c2 > $L/caches.txt
cd $OUT && tar czf logs.tgz logs && rm -rf logs

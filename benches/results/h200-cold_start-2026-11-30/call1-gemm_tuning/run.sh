#!/bin/bash
# Session 17, call 6: how long the server's warm-up takes with and without the prefill GEMMs'
# algorithm timing (DELTASERVE_GEMM_TUNE=0), the random 1.39B (vocabulary 4,096) served on the
# GPU, at the default step budget (512) and at 2,048; alternating, each start's "warmed up"
# line (prefill passes, decode batch sizes, graph shapes, seconds).
mkdir -p /tmp/s && tar -C /tmp/s -xJf .devbuild/s1.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run36.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
M=/tmp/gdn-v4096
python3 -c "import json; c = json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size'] = 4096; json.dump(c, open('/tmp/cfg.json', 'w'))"
/tmp/s/deltaserve init-random --config /tmp/cfg.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1; echo "init rc=$?"
for budget in 512 2048; do
  for tune in 1 0 1 0; do
    f=$L/serve-b$budget-t$tune-$RANDOM.log
    s=$(date +%s.%N)
    DELTASERVE_GEMM_TUNE=$tune /tmp/s/deltaserve serve --model $M --device cuda --dtype bf16 --port 18600 \
      --max-num-batched-tokens $budget > $f 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do grep -q 'warmed up\|warm-up failed' $f && break; sleep 0.2; done
    e=$(date +%s.%N)
    kill $pid; wait $pid 2>/dev/null
    echo "budget $budget tune $tune: start to warmed $(python3 -c "print(round($e - $s, 1))") s; $(grep -o 'warmed up.*' $f | head -1; grep -o 'prefill_passes.*secs=[0-9.]*' $f | head -1)"
  done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

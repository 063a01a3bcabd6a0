#!/bin/bash
# Session 17, call 7: kernels embedded as sm_90a SASS (no driver JIT at load). On a fresh
# machine (cold JIT cache): the random 1.39B served on the GPU, the first start's warm-up and a
# second start's; then the whole GPU suite on the same build.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/k1.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run37.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
ls -la ~/.nv/ComputeCache 2>&1 | head -3 > $L/jit_cache_before.txt; du -sh ~/.nv 2>&1 >> $L/jit_cache_before.txt
M=/tmp/gdn-v4096
python3 -c "import json; c = json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size'] = 4096; json.dump(c, open('/tmp/cfg.json', 'w'))"
/tmp/n/deltaserve init-random --config /tmp/cfg.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1; echo "init rc=$?"
for i in 1 2; do
  f=$L/serve-$i.log
  s=$(date +%s.%N)
  /tmp/n/deltaserve serve --model $M --device cuda --dtype bf16 --port 18600 > $f 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do grep -q 'warmed up\|warm-up failed\|Error' $f && break; sleep 0.2; done
  e=$(date +%s.%N)
  kill $pid; wait $pid 2>/dev/null
  echo "start $i: to warmed $(python3 -c "print(round($e - $s, 1))") s; $(sed 's/\x1b\[[0-9;]*m//g' $f | grep -o 'warmed up.*' | head -1)"
done
du -sh ~/.nv 2>&1 > $L/jit_cache_after.txt; cat $L/jit_cache_after.txt
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 170 /tmp/n/gpu_tests $T > $L/tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked" $L/tests.log | tail -4
cd $OUT && tar czf logs.tgz logs && rm -rf logs

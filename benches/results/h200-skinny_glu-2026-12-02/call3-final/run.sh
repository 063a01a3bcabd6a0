#!/usr/bin/env bash
# The final build (e5e8160): the GPU suite; served 1.39B (vocabulary 4,096) at 16 streams with
# both folds off (DELTASERVE_SKINNY_GLU=0 DELTASERVE_CONV_FOLD=0) and on, in turn, two rounds,
# beside the bare batch-16 step.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t130.tar.xz; tar -C /tmp/n -xJf .devbuild/b130.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 230 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -a "FAILED\|panicked\|GPU tests:" $L/gpu_tests.log | head -20; grep -a "skinny GEMMs\|conv in the skinny" $L/gpu_tests.log | head -4
V=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $V/config.json ] || /tmp/n/deltaserve init-random --config $L/config.json -o $V --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
for env in "DELTASERVE_SKINNY_GLU=0 DELTASERVE_CONV_FOLD=0" ""; do
  timeout 60 env $env /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $V --batches 16 > $L/bare-${env:+off}on.log 2>&1
  echo "bare ${env:-on}: $(grep -E '^\| [0-9]+ \| yes' $L/bare-${env:+off}on.log | awk -F'|' '{printf "%s: %.4f ms %s tok/s ", $2, 1000*$2/$5, $5}') at ${SECONDS}s"
done
printf '#!/bin/sh\nDELTASERVE_SKINNY_GLU=0 DELTASERVE_CONV_FOLD=0 exec /tmp/n/deltaserve "$@"\n' > /tmp/off.sh; chmod +x /tmp/off.sh
C=16 ROUNDS=2 MODEL=$V timeout $((585 - SECONDS)) bash benches/ab_serving.sh /tmp/off.sh /tmp/n/deltaserve /tmp/n/serve_bench $L/serve > $L/serve.log 2>&1; echo "serve rc $? at ${SECONDS}s"
cat $L/serve/ab.md
rm -f $L/serve/serve-*.log
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

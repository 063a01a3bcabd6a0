#!/usr/bin/env bash
# The prefill mixer against fla 0.6.0 with the 1.39B's shapes (K = 256), the split-key pass and
# mma.sync (DELTASERVE_TC_WG=0) alternating, two rounds; then the served 1.39B (vocabulary 4,096)
# at 64 streams, the same binary with and without the pass (ab_serving.sh), beside its bare step.
L=$OUT/logs; mkdir -p $L/mixer /tmp/n
tar -C /tmp/n -xJf .devbuild/b95.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
FLA=$(mktemp -d); pip install --quiet --no-deps --no-index --target "$FLA" .whl/*.whl 2>/dev/null
PYTHONPATH=$FLA timeout 240 python3 benches/fla_mixer.py $L/mixer/fla_mixer.json 2>$L/mixer/fla_mixer.log; echo "fla rc $? at ${SECONDS}s"
grep 'prefill\|decode' $L/mixer/fla_mixer.log
for r in 1 2; do
  timeout 70 /tmp/n/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/split_$r.md 2>&1; echo "split $r rc $? at ${SECONDS}s"
  DELTASERVE_TC_WG=0 timeout 70 /tmp/n/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/mma_$r.md 2>&1; echo "mma $r rc $? at ${SECONDS}s"
done
for f in $L/mixer/split_*.md $L/mixer/mma_*.md; do echo $f; grep '^| [0-9]' $f; done
V=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $V/config.json ] || /tmp/n/deltaserve init-random --config $L/config.json -o $V --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
timeout 90 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $V --batches 64 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s: %.4f ms %s tok/s ", $2, 1000*$2/$5, $5}') at ${SECONDS}s"
printf '#!/bin/sh\nDELTASERVE_TC_WG=0 exec /tmp/n/deltaserve "$@"\n' > /tmp/mma.sh; chmod +x /tmp/mma.sh
C=64 ROUNDS=2 MODEL=$V timeout $((580 - SECONDS)) bash benches/ab_serving.sh /tmp/mma.sh /tmp/n/deltaserve /tmp/n/serve_bench $L/serve > $L/serve.log 2>&1; echo "serve rc $? at ${SECONDS}s"
cat $L/serve/ab.md
rm -f $L/serve/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

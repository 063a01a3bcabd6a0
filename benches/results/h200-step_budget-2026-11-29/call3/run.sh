#!/bin/bash
# Call 6: is the streams-alone ITL p99 of call 5's `b1024g` (5.74 against 3.50 ms) the mixed
# graphs' or that run's? Long prompts under 32 streams at budget 1024, mixed graphs to 1024 (g)
# and to 512 (e), alternating, two rounds each.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run6.sh $L/run.sh
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $M/config.json ] || /tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --max-num-batched-tokens 1024\n' > /tmp/b/b1024; chmod +x /tmp/b/b1024
printf '#!/bin/sh\nexec /tmp/b/deltaserve "$@" --max-num-batched-tokens 1024 --mixed-graph-tokens 1024\n' > /tmp/b/b1024g; chmod +x /tmp/b/b1024g
MODEL=$M timeout 300 bash benches/long_prompts.sh /tmp/b/serve_bench $L/long g1=/tmp/b/b1024g e1=/tmp/b/b1024 g2=/tmp/b/b1024g e2=/tmp/b/b1024 > $L/long.log 2>&1
echo "long rc=$?"; grep -v "ITL after" $L/long/table.md | grep -v "long-prompts |"; grep "ITL after" $L/long/table.md
for f in $L/long/*-streams-*.json; do python3 -c "
import json; d=json.load(open('$f')); e=d['engine']; print('$(basename $f)', 'itl p90/p99', round(d['itl_window_ms']['p90'],2), round(d['itl_window_ms']['p99'],2), 'decode mean', round(e['decode']['mean_ms'],3), 'mixed', e['mixed']['steps'], round(e['mixed']['mean_ms'],2))"; done
rm -f $L/long/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

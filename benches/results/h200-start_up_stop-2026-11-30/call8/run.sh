#!/bin/bash
# Session 18, call 8 (the machine of call 7, its driver cache warm): a SIGTERM during start-up. Fresh machine, the 1.39B (vocabulary 4,096):
# start 1 gets SIGTERM 1 s into its first (cold) warm-up, start 2 0.5 s into a warm one,
# start 3 warms up in full and is stopped after.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/k10.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run46.sh $L/run.sh
M=/tmp/gdn-v4096
python3 -c "import json; c = json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size'] = 4096; json.dump(c, open('/tmp/cfg.json', 'w'))"
[ -d $M ] || /tmp/n/deltaserve init-random --config /tmp/cfg.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1; echo "init rc=$?"
for i in 2 3; do
  f=$L/sigterm-$i.log
  /tmp/n/deltaserve serve --model $M --device cuda --dtype bf16 --port 18600 > $f 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do grep -q 'prefix cache' $f && break; sleep 0.05; done
  case $i in
    1) sleep 1;;
    2) sleep 0.3;;
    3) for _ in $(seq 1 600); do grep -q 'warmed up\|warm-up failed' $f && break; sleep 0.1; done;;
  esac
  s=$(date +%s.%N); kill -TERM $pid; wait $pid; rc=$?; e=$(date +%s.%N)
  echo "start $i: exited rc=$rc $(python3 -c "print(round($e - $s, 2))") s after SIGTERM"
  sed 's/\x1b\[[0-9;]*m//g' $f | grep -o 'shutdown during.*\|the load is still.*\|warm-up stopped.*\|warmed up.*\|shut down.*\|ready.*' | cut -c1-160
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

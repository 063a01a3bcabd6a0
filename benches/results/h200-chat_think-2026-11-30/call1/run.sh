#!/bin/bash
# Call 3: the chat workload (8 conversations, 8 turns), with the prefix cache and without, two
# rounds: (a) turns sent at once (as before), (b) with a person's pause (--think-ms 300), (c) the
# same pause with a character tokenizer whose answers come back as the same ids.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run3.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
for v in a b c; do
  case $v in
    a) E="MODEL=/tmp/chat-1.3b THINK_MS=0" ;;
    b) E="MODEL=/tmp/chat-1.3b THINK_MS=300" ;;
    c) python3 benches/char_tokenizer.py /tmp/chartok > $L/chartok.log
       E="MODEL=/tmp/chat-char TOKENIZER_FROM=/tmp/chartok VOCAB=4096 SYSTEM_TOKENS=630 THINK_MS=300" ;;
  esac
  s=$(date +%s)
  env $E ROUNDS=2 CONVS=8 TURNS=8 timeout 170 bash benches/prefix_cache_chat.sh /tmp/n/loadgen $L/$v deltaserve=/tmp/n/deltaserve > $L/$v.log 2>&1
  echo "$v ($E) rc=$? $(( $(date +%s) - s )) s"; grep -E "^## |turns 2|hits_total|queries_total" $L/$v/chat.md
  rm -f $L/$v/serve-*.log
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

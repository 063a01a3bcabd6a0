#!/usr/bin/env bash
# Served short requests on the Qwen3.5-2B layout (b149, the model of run149): prefill and mixed
# graphs off against on, 16 streams of 100-token prompts and 128-token outputs, two rounds.
L=$OUT/logs; mkdir -p $L; cp .devbuild/run150.sh $L/run.sh
SECONDS=0
M=/tmp/q35-v4096
[ -f $M/model.safetensors ] || { echo "no model (a fresh machine)"; exit 1; }
C=16 IN_LEN=100 OUT_LEN=128 ROUNDS=2 MODEL=$M READY_SECS=200 timeout 400 bash benches/ab_serving.sh /tmp/n/graphs_off /tmp/n/deltaserve /tmp/n/serve_bench $L/served16 > $L/served16.log 2>&1
echo "served rc $? at ${SECONDS}s"; cat $L/served16/ab.md; tail -2 $L/served16.log
rm -f $L/served16/*.json

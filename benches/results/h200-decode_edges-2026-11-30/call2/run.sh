#!/bin/bash
# Call 5: a decode step's inputs in one upload and its logits lent from the graph's buffer.
# GPU tests (graphs against eager with lent and copied logits, models, mixed graphs, attention),
# the GPU server against the CPU server (gdn, qwen3_5), then decode steps with the logits lent
# (n) against copied (o: DELTASERVE_DECODE_COPY=1), alternating, three rounds; then the served
# 1.39B (vocabulary 4,096) at 1, 16 and 64 streams against the bare step.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run5.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
DELTASERVE_TESTS_DIR=$PWD/tests timeout 300 /tmp/n/gpu_tests gpu_decode_graphs_equal_eager_decode gpu_models_match_cpu_and_goldens gpu_mixed_graphs_equal_eager_mixed_passes gpu_paged_attention_matches_cpu gpu_batch_invariant_mode_logits_do_not_depend_on_the_batch gpu_warm_up_leaves_the_pool_as_it_was > $L/tests.log 2>&1
echo "tests rc=$?"; grep -E "GPU tests|FAIL|panicked" $L/tests.log | tail -5
for m in gdn qwen3_5; do LOGS=$L/serve-check-$m timeout 240 bash scripts/gpu-serve-check.sh /tmp/n/deltaserve tests/fixtures/compact/$m > $L/serve-check-$m.log 2>&1; echo "serve-check $m rc=$? $(tail -1 $L/serve-check-$m.log)"; done
[ -f /tmp/q35/config.json ] || python3 -c "import sys; sys.path.insert(0,'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
M=/tmp/gdn13
run() { if [ $1 = o ]; then DELTASERVE_DECODE_COPY=1 "${@:2}"; else "${@:2}"; fi; }
i=0
for b in o n o n o n; do
  i=$((i+1))
  run $b timeout 60 /tmp/n/gpu_bench --hybrid-dir /tmp/q35 --no-prefill --batches 1,2,16,64 > $L/q35-$i-$b.log 2>&1
  echo "q35 $b: $(grep -h '"decode"' $L/q35-$i-$b.log | python3 -c "
import sys,json
for l in sys.stdin:
  d=json.loads(l[5:]); print(d['batch'], '%.4f' % d['ms'], '%.2f%%' % (100*d['roofline_ms']/d['ms']), end='  ')")"
done
for b in o n o n o n; do
  i=$((i+1))
  run $b timeout 60 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 1,16,64 > $L/model-$i-$b.log 2>&1
  echo "gdn $b: $(grep -E '^\| [0-9]+ \| yes' $L/model-$i-$b.log | awk -F'|' '{printf "%s: %.4f ms %s ", $2, 1000*$2/$5, $7}')"
done
V=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
[ -f $V/config.json ] || /tmp/n/deltaserve init-random --config $L/config.json -o $V --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
timeout 120 /tmp/n/gpu_bench --model-only --no-prefill --graphs-only --model-dir $V --batches 1,16,64 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s: %.4f ms %s tok/s ", $2, 1000*$2/$5, $5}')"
MODEL=$V timeout 220 bash benches/serving_sweep.sh /tmp/n/deltaserve /tmp/n/serve_bench $L/sweep 1 16 64 > $L/sweep.log 2>&1
echo "sweep rc=$?"; cat $L/sweep/table.md
rm -f $L/sweep/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

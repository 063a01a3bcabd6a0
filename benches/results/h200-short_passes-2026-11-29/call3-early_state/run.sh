#!/bin/bash
# Call 3: the state pass's loads issued before its wait for the prep (which triggers it early);
# GPU suite; prefill graphs and eager short passes, head (916e4e0) against new alternating; the
# chat workload with and without the prefix cache on the new server.
mkdir -p /tmp/h /tmp/b && tar -C /tmp/h -xJf .devbuild/head.tar.xz && tar -C /tmp/b -xJf .devbuild/new.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run3.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
M=/tmp/deltaserve-gdn-1.3b
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/b/gpu_tests > $L/gpu_tests.log 2>&1
echo "gpu_tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests:" $L/gpu_tests.log; grep -E "panicked|FAILED" -A3 $L/gpu_tests.log | head -30
s=$(date +%s); timeout 120 /tmp/b/gpu_bench --model-only --batches 1 --graphs-only > $L/model-new0.md 2>&1; echo "model rc=$? $(( $(date +%s) - s )) s"
for r in 1 2; do for b in h b; do
  s=$(date +%s); timeout 100 /tmp/$b/gpu_bench --prefill-graphs --model-dir $M > $L/graphs-$b-$r.md 2>&1; echo "graphs $b rc=$? $(( $(date +%s) - s )) s"
done; done
for b in h b; do timeout 100 /tmp/$b/gpu_bench --small-prefill --model-dir $M > $L/small-$b.md 2>&1; echo "small $b rc=$?"; done
s=$(date +%s)
MODEL=/tmp/chat-1.3b ROUNDS=2 CONVS="1 8" TURNS=8 timeout 400 bash benches/prefix_cache_chat.sh /tmp/b/loadgen $L/chat new=/tmp/b/deltaserve > $L/chat.log 2>&1
echo "chat rc=$? $(( $(date +%s) - s )) s"
grep -E "^##|^\| [18] \|" $L/chat/chat.md | head -40
cd $OUT && tar czf logs.tgz logs && rm -rf logs

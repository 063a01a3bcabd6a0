#!/usr/bin/env bash
# exp2 without its denormal path in the tensor-core prefill attention's shared softmax step: the
# GPU suite, then this build's attention op against HEAD's (b39), alternating, and the mma.sync
# kernel's; then the Qwen3.5 layout's prefill, HEAD against this build, as time allows.
L=$OUT/logs; mkdir -p $L /tmp/n /tmp/b
tar -C /tmp/n -xJf .devbuild/t40.tar.xz; tar -C /tmp/n -xJf .devbuild/b40.tar.xz; tar -C /tmp/b -xJf .devbuild/b39.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests $T --nocapture > $L/gpu_tests.log 2>&1; echo "gpu tests rc $? at ${SECONDS}s"
grep -c "^test .* ok$" $L/gpu_tests.log; grep -a "FAILED\|panicked\|warpgroup kernel within\|paged attention HQ 8 HKV 2 hd 256 rot 64 window None BF16 in place true\|test result" $L/gpu_tests.log | head
for r in 1 2; do
  timeout 30 /tmp/n/gpu_bench --attention-only > $L/attn-new-$r.log 2>&1; echo "new $r rc $? at ${SECONDS}s"
  timeout 30 /tmp/b/gpu_bench --attention-only > $L/attn-head-$r.log 2>&1; echo "head $r rc $? at ${SECONDS}s"
done
DELTASERVE_ATTN_WG=0 timeout 30 /tmp/n/gpu_bench --attention-only > $L/attn-new-mma.log 2>&1
DELTASERVE_ATTN_WG=0 timeout 30 /tmp/b/gpu_bench --attention-only > $L/attn-head-mma.log 2>&1
for f in new-1 head-1 new-2 head-2 new-mma head-mma; do echo "$f $(grep '^OURS' $L/attn-$f.log | head -3 | python3 -c 'import sys,json; print(" ".join("%.4f" % json.loads(l[5:])["ms"] for l in sys.stdin))')"; done
MODELS=q35 PREFILL=1 ROUNDS=2 BATCHES=1 TIMEOUT=60 timeout $((300 - SECONDS)) bash benches/ab_decode.sh $L/ab new=/tmp/n/gpu_bench head=/tmp/b/gpu_bench; echo "ab rc $? at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

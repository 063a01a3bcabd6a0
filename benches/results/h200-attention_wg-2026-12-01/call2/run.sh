#!/usr/bin/env bash
# The warpgroup prefill attention with its producer pipelined (tile j + 1 issued before tile j
# is waited for, offsets read two tiles ahead): its GPU test, the op against SDPA on and off
# (alternating), and Nsight Compute on both kernels at T=4096.
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/t35.tar.xz; tar -C /tmp/n -xJf .devbuild/b35.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
DELTASERVE_TESTS_DIR=$PWD/tests timeout 120 /tmp/n/gpu_tests gpu_paged_attention_matches_cpu --nocapture > $L/attn_test.log 2>&1; echo "attn test rc $? in ${SECONDS}s"
grep -a "paged attention:\|panicked\|FAILED\|test result" $L/attn_test.log | tail -8
for r in 1 2; do
  timeout 100 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --attention > $L/attn-wg-$r.md 2>&1; echo "wg $r rc $? at ${SECONDS}s"
  DELTASERVE_ATTN_WG=0 timeout 100 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --attention > $L/attn-mma-$r.md 2>&1; echo "mma $r rc $? at ${SECONDS}s"
done
grep -h "^| [0-9]" $L/attn-wg-1.md $L/attn-mma-1.md $L/attn-wg-2.md $L/attn-mma-2.md | head -28
which ncu cuobjdump > $L/tools.txt 2>&1
for k in wg tiles; do
  timeout 150 ncu --set full -k regex:attn_$k --launch-count 1 -f -o $L/ncu-$k /tmp/n/gpu_bench --attention-only --reps 1 > $L/ncu-$k.log 2>&1; echo "ncu $k rc $? at ${SECONDS}s"
  ncu -i $L/ncu-$k.ncu-rep --page details > $L/ncu-$k-details.txt 2>&1
  ncu -i $L/ncu-$k.ncu-rep --page source --csv --print-source sass > $L/ncu-$k-sass.csv 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" $L/ncu-$k-details.txt | head -12
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

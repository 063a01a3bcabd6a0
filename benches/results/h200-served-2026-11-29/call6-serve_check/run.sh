#!/bin/bash
# Call 8: the GPU serving check (GPU text == CPU text, 8 concurrent greedy completions) with the
# decode steps launched ahead and chained (the build of call 7 with --decode-ahead), on the
# compact Gated DeltaNet, Gated DeltaProduct and Qwen3.5 fixtures.
mkdir -p /tmp/b && xz -dc .devbuild/chain.xz > /tmp/b/deltaserve-chain && chmod +x /tmp/b/deltaserve-chain
printf '#!/bin/sh\nexec /tmp/b/deltaserve-chain "$@" --decode-ahead\n' > /tmp/b/chain; chmod +x /tmp/b/chain
L=$OUT/logs; mkdir -p $L; cp .devbuild/run8.sh $L/run.sh
for m in gdn gdp qwen3_5; do
  LOGS=$L/$m timeout 50 bash scripts/gpu-serve-check.sh /tmp/b/chain tests/fixtures/compact/$m > $L/check-$m.log 2>&1
  echo "$m rc=$?: $(tail -1 $L/check-$m.log)"
done
rm -rf $L/*/
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# The split-key pass: Y issued after Z's wait (-DSPLIT_Y_LATE) against HEAD's order, probe
# processes alternating (bits hashed); then the prefill mixer against fla 0.6.0 with the 1.39B's
# shapes, the pass and mma.sync (DELTASERVE_TC_WG=0) alternating, two rounds.
L=$OUT/logs; mkdir -p $L/mixer /tmp/n
tar -C /tmp/n -xJf .devbuild/b93.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
nvcc .devbuild/wgp.o -o /tmp/wgp && nvcc .devbuild/wgp_late.o -o /tmp/wgp_late
for r in 1 2; do for v in wgp wgp_late; do for s in "check K=256" "check K=192" "1.39B"; do
  PROBE_ONLY="$s" timeout 60 /tmp/$v >> $L/probe_${v}_$r.md 2>&1
done; done; done
for f in $L/probe_*.md; do echo "== $f"; grep -a 'hash\|^## \|keys split\|32 columns double\|FAIL' $f; done
echo "probes at ${SECONDS}s"
FLA=$(mktemp -d); pip install --quiet --no-deps --no-index --target "$FLA" .whl/*.whl 2>/dev/null
PYTHONPATH=$FLA timeout 330 python3 benches/fla_mixer.py $L/mixer/fla_mixer.json 2>$L/mixer/fla_mixer.log; echo "fla rc $? at ${SECONDS}s"
grep prefill $L/mixer/fla_mixer.log
for r in 1 2; do
  timeout 70 /tmp/n/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/split_$r.md 2>&1; echo "split $r rc $? at ${SECONDS}s"
  DELTASERVE_TC_WG=0 timeout 70 /tmp/n/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/mma_$r.md 2>&1; echo "mma $r rc $? at ${SECONDS}s"
  [ $SECONDS -gt 480 ] && break
done
for f in $L/mixer/split_*.md $L/mixer/mma_*.md; do echo $f; grep '^| [0-9]' $f; done
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

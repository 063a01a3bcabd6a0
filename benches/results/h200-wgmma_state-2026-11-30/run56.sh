#!/usr/bin/env bash
# The prefill mixer against fla with the warpgroup state pass on and off, alternating, one call.
L=$OUT/logs; mkdir -p $L/mixer /tmp/n
tar -C /tmp/n -xJf .devbuild/k19.tar.xz
FLA=$(mktemp -d); pip install --quiet --no-deps --no-index --target "$FLA" .whl/*.whl 2>/dev/null
PYTHONPATH=$FLA timeout 100 python3 benches/fla_mixer.py $L/mixer/fla_mixer.json 2>$L/mixer/fla_mixer.log; echo "fla rc $?"
for r in 1 2; do
  timeout 60 /tmp/n/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/on_$r.md 2>&1; echo "on $r rc $?"
  DELTASERVE_TC_WG=0 timeout 60 /tmp/n/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/off_$r.md 2>&1; echo "off $r rc $?"
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

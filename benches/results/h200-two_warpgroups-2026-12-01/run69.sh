#!/usr/bin/env bash
# Two-warpgroup pass: the probe's producer-order (v3) and value-major O staging (v3 + nmajor)
# variants against the one-warpgroup pass; the engine's mixer (v2 in the build) against fla, the
# two-warpgroup pass on and off alternating.
L=$OUT/logs; mkdir -p $L/mixer /tmp/n
tar -C /tmp/n -xJf .devbuild/k24.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
E=.devbuild/exp
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -I$E/cuda $E/wg_state_probe.cu -o /tmp/v3 > $L/build_v3.log 2>&1 &
nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -I$E/cuda -DWS_NMAJOR $E/wg_state_probe.cu -o /tmp/v3n > $L/build_v3n.log 2>&1 &
FLA=$(mktemp -d); pip install --quiet --no-deps --no-index --target "$FLA" .whl/*.whl 2>/dev/null
PYTHONPATH=$FLA timeout 100 python3 benches/fla_mixer.py $L/mixer/fla_mixer.json 2>$L/mixer/fla_mixer.log; echo "fla rc $?"
for r in 1 2; do
  timeout 60 /tmp/n/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/on_$r.md 2>&1; echo "on $r rc $?"
  DELTASERVE_TC_WS=0 timeout 60 /tmp/n/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/off_$r.md 2>&1; echo "off $r rc $?"
done
for f in $L/mixer/on_1.md $L/mixer/off_1.md $L/mixer/on_2.md $L/mixer/off_2.md; do echo $f; grep '^| [0-9]' $f; done
wait
cat $L/build_v3.log $L/build_v3n.log | grep -i error
for v in v3 v3n; do timeout 120 /tmp/$v > $L/probe_$v.md 2>&1; echo "probe $v rc $?"; grep -E '^## [0-9Q]|wgmma|FAIL|DIFF|ALL' $L/probe_$v.md | grep -v 'e-03 |'; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

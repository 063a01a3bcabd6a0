#!/usr/bin/env bash
# HEAD's build and this one: the prefill mixer against fla (alternating, two rounds), then both
# models' T=4096 prefill (bf16 and near-fp32 mixer) and decode steps at batch 1 and 64
# (alternating, two rounds).
L=$OUT/logs; mkdir -p $L/mixer /tmp/n /tmp/b
tar -C /tmp/n -xJf .devbuild/n29.tar.xz
tar -C /tmp/b -xJf .devbuild/b28.tar.xz
SECONDS=0
FLA=$(mktemp -d); pip install --quiet --no-deps --no-index --target "$FLA" .whl/*.whl 2>/dev/null
PYTHONPATH=$FLA timeout 100 python3 benches/fla_mixer.py $L/mixer/fla_mixer.json 2>$L/mixer/fla_mixer.log; echo "fla rc $?"
for r in 1 2; do
  timeout 60 /tmp/b/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/head_$r.md 2>&1; echo "head $r rc $?"
  timeout 60 /tmp/n/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/new_$r.md 2>&1; echo "new $r rc $?"
done
for f in $L/mixer/head_1.md $L/mixer/new_1.md $L/mixer/head_2.md $L/mixer/new_2.md; do echo $f; grep '^| [0-9]' $f; done
echo "at ${SECONDS}s"
PREFILL=1 ROUNDS=2 BATCHES=1,64 TIMEOUT=80 timeout $((570 - SECONDS)) bash benches/ab_decode.sh $L/ab head=/tmp/b/gpu_bench new=/tmp/n/gpu_bench > $L/ab.log 2>&1; echo "ab rc $? at ${SECONDS}s"
cat $L/ab/summary.md 2>/dev/null | head -30
cd $OUT && tar czf logs.tgz logs && rm -rf logs

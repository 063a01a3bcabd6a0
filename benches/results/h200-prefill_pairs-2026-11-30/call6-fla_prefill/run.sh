#!/bin/bash
# Session 16, call 6 (call 5 again, our runs given 100 s: cold, they passed 40): the 1.39B's T=4096 prefill against transformers + fla 0.6.0 in the same
# call (benches/fla_prefill.py, median of 20), HEAD's build before and after it.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/h4.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run29.sh $L/run.sh
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl > $L/pip.log 2>&1; echo "pip rc=$?"
s=$(date +%s)
timeout 100 /tmp/n/gpu_bench --model-only --reps 3 > $L/gdn-1.log 2>&1
PYTHONPATH=$FLA timeout 230 python3 benches/fla_prefill.py /tmp/deltaserve-gdn-1.3b $L/fla_prefill.json 4096 20 > $L/fla_prefill.log 2>&1
echo "fla_prefill rc=$? $(( $(date +%s) - s )) s"; tail -1 $L/fla_prefill.log; cat $L/fla_prefill.json
timeout 100 /tmp/n/gpu_bench --model-only --reps 3 > $L/gdn-2.log 2>&1
for f in $L/gdn-*.log; do echo "$(basename $f): $(grep '^prefill B=1, T=4096' $f | sed 's/  */ /g' | cut -c1-100 | tr '\n' '|')"; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Session 16, call 4: HEAD's build (the flat-grid prep, the GVA-paired chunk prep, two-head
# attention at d = 256, the timed prefill GEMMs): the whole GPU suite, then transformers + fla
# in the same call (the Qwen3.5 layout by benches/hybrid_vs_hf.py; the 1.39B's prefill by
# benches/fla_prefill.py between two of ours).
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/h4.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run28.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
s=$(date +%s)
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 170 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1
echo "suite rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked" $L/gpu_tests.log | tail -4
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl > $L/pip.log 2>&1; echo "pip rc=$?"
s=$(date +%s)
PYTHONPATH=$FLA timeout 280 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1
echo "hybrid rc=$? $(( $(date +%s) - s )) s"; tail -8 $L/hybrid_vs_hf.log
s=$(date +%s)
timeout 40 /tmp/n/gpu_bench --model-only --reps 3 > $L/gdn-1.log 2>&1
PYTHONPATH=$FLA timeout 80 python3 benches/fla_prefill.py /tmp/deltaserve-gdn-1.3b $L/fla_prefill.json 4096 20 > $L/fla_prefill.log 2>&1
echo "fla_prefill rc=$? $(( $(date +%s) - s )) s"; tail -1 $L/fla_prefill.log
timeout 40 /tmp/n/gpu_bench --model-only --reps 3 > $L/gdn-2.log 2>&1
for f in $L/gdn-*.log; do echo "$(basename $f): $(grep '^prefill B=1, T=4096' $f | sed 's/  */ /g' | cut -c1-100 | tr '\n' '|')"; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

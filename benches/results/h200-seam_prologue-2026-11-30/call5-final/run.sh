#!/bin/bash
# Seam prologue, call 5: the final build (two rows' h, delta and nw loaded together, the norm
# kernel's bits; one row as before). The GPU suite (every test of tests/gpu.rs but tensor
# parallelism), decode steps at batch 1 and 2 against HEAD (base), alternating, two rounds, both
# models, then the Qwen3.5 layout against transformers + fla in one run.
mkdir -p /tmp/n /tmp/b && tar -C /tmp/n -xJf .devbuild/n1.tar.xz && tar -C /tmp/b -xJf .devbuild/b.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run16.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 220 /tmp/n/gpu_tests $T > $L/gpu_tests.log 2>&1
echo "tests rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked" $L/gpu_tests.log | tail -8
s=$(date +%s)
ROUNDS=2 BATCHES=1,2 TIMEOUT=80 bash benches/ab_decode.sh $L/ab base=/tmp/b/gpu_bench new=/tmp/n/gpu_bench > $L/ab.out 2>&1
echo "ab rc=$? $(( $(date +%s) - s )) s"; cat $L/ab/summary.md
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl > $L/pip.log 2>&1; echo "pip rc=$?"
s=$(date +%s)
PYTHONPATH=$FLA timeout 200 python3 benches/hybrid_vs_hf.py --bench-bin /tmp/n/gpu_bench --dir /tmp/q35 > $L/hybrid_vs_hf.log 2>&1
echo "hybrid rc=$? $(( $(date +%s) - s )) s"; tail -8 $L/hybrid_vs_hf.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

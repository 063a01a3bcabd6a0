#!/bin/bash
# Device call 1: baseline of the prefill mixers (bf16 and near-fp32) against fla 0.6.0 on the
# H200, per-kernel times under nsys, and the whole 1.39B's prefill T=4096 against transformers + fla.
mkdir -p /tmp/m && tar -C /tmp/m -xJf .devbuild/main.tar.xz
L=$OUT/logs; mkdir -p $L
cp .devbuild/run1.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv > $L/gpu.txt
which nsys ncu > $L/tools.txt 2>&1
FLA=/tmp/fla; pip install --quiet --no-deps --no-index --target $FLA .whl/*.whl
s=$(date +%s)
timeout 150 bash benches/mixer_vs_fla.sh /tmp/m/gpu_bench $L/mixers > $L/mixers.out 2>&1
echo "mixers rc=$? $(( $(date +%s) - s )) s"; grep -A8 "^## Prefill mixer" $L/mixers/gpu_bench_mixers.md
s=$(date +%s)
timeout 120 nsys profile -o $L/mix --force-overwrite true /tmp/m/gpu_bench --skip-model --reps 3 > $L/nsys.out 2>&1
echo "nsys rc=$? $(( $(date +%s) - s )) s"
nsys stats --report cuda_gpu_trace --format csv -o $L/trace $L/mix.nsys-rep > /dev/null 2>&1
python3 - $L/trace_cuda_gpu_trace.csv <<'PY' | tee $L/chunk_kernels.md
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
agg = collections.defaultdict(list)
for r in rows:
    n = r.get("Name", "")
    if "chunk" not in n: continue
    key = (n.split("(")[0], r.get("GrdX"), r.get("GrdY"), r.get("GrdZ"))
    agg[key].append(float(r["Duration (ns)"]) / 1e3)
print("| kernel | grid | launches | median µs |")
print("|---|---|---|---|")
for k, v in agg.items():
    v.sort(); print(f"| {k[0]} | {k[1]}x{k[2]}x{k[3]} | {len(v)} | {v[len(v)//2]:.1f} |")
PY
rm -f $L/mix.sqlite
s=$(date +%s)
timeout 150 /tmp/m/gpu_bench --model-only --batches 1 --graphs-only > $L/model.md 2>&1
echo "model rc=$? $(( $(date +%s) - s )) s"; grep -i "prefill" $L/model.md
PYTHONPATH=$FLA timeout 120 python3 benches/fla_prefill.py /tmp/deltaserve-gdn-1.3b $L/fla_prefill.json > $L/fla_prefill.log 2>&1
echo "fla_prefill rc=$?"; tail -2 $L/fla_prefill.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# The fused conv + prep at 1-8 rows a warp (DELTASERVE_CONV_PREP_ROWS) against the conv's and the
# prep's launches apart (DELTASERVE_CONV_PREP=0): kernel times at T=4096 bf16 prefills under
# Nsight Compute (clocks and caches left as they are), the Qwen3.5 layout (K = 128) and the
# 1.39B (K = 256).
L=$OUT/logs; mkdir -p $L /tmp/n
tar -C /tmp/n -xJf .devbuild/b137.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
python3 -c "import sys; sys.path.insert(0, 'benches'); from hybrid_vs_hf import build; build('/tmp/q35')" > $L/build_q35.log 2>&1
timeout 120 /tmp/n/gpu_bench --model-only --model-dir /tmp/gdn --batches 1 > $L/gdn_model.md 2>&1
echo "built at ${SECONDS}s"
prof() { # name env model-args
  timeout 90 env $2 ncu --profile-from-start off --clock-control none --cache-control none \
    --kernel-name regex:"conv_prep|conv_prefill|prep_bf16" --launch-count 9 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread --csv --page raw \
    /tmp/n/gpu_bench $3 > $L/ncu_$1.csv 2> $L/ncu_$1.err
  python3 - $L/ncu_$1.csv $1 <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
if not rows: sys.exit(print(sys.argv[2], "no rows"))
u = rows[0]
t = collections.defaultdict(list)
f = lambda r, k: float(r[k].replace(',', ''))
for r in rows[1:]:
    try: t[r["Kernel Name"]].append((f(r, "gpu__time_duration.sum"), f(r, "dram__bytes_read.sum"), f(r, "dram__bytes_write.sum"), r["launch__registers_per_thread"]))
    except (ValueError, KeyError, TypeError): pass
for k, v in t.items():
    us = sorted(x[0] for x in v)
    print(f"{sys.argv[2]:>10} {k:40} n={len(v)} median {us[len(us)//2]} {u['gpu__time_duration.sum']}  read {v[0][1]} {u['dram__bytes_read.sum']} written {v[0][2]} {u['dram__bytes_write.sum']}  regs {v[0][3]}")
PY
}
Q="--hybrid-dir /tmp/q35 --batches 1 --reps 1 --profile-hybrid-prefill"
G="--profile-prefill --model-dir /tmp/gdn"
prof q35_off DELTASERVE_CONV_PREP=0 "$Q"
for r in 2 4 8; do prof q35_r$r DELTASERVE_CONV_PREP_ROWS=$r "$Q"; done
prof gdn_off DELTASERVE_CONV_PREP=0 "$G"
for r in 1 2 4; do prof gdn_r$r DELTASERVE_CONV_PREP_ROWS=$r "$G"; done
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/usr/bin/env bash
# A probe for a later change, no deltaserve code: what cuBLAS charges for adding the residual in
# the projection's epilogue (beta = 1, C = D = the residual, in place) at the Qwen3.5 layout's
# T=4096 shapes, against the plain product (beta = 0), through torch's addmm_ / mm (cuBLAS),
# CUDA-event medians of 50, the two alternating.
L=$OUT/logs; mkdir -p $L; cp .devbuild/run146.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
python3 - > $L/beta_probe.md 2>&1 <<'PY'
import torch
torch.manual_seed(0)
def ms(f, reps=50):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for i in range(reps + 5):
        s.record(); f(); e.record(); torch.cuda.synchronize()
        if i >= 5: out.append(s.elapsed_time(e))
    out.sort(); return out[len(out) // 2]
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}\n")
print("| projection (M=4096) | N x K | mm (beta 0) ms | addmm_ into the residual (beta 1) ms | extra µs | mm TFLOP/s |")
print("|---|---|---|---|---|---|")
for name, n, k in [("down", 2048, 6144), ("out_proj", 2048, 4096), ("o_proj", 2048, 2048), ("gate_up", 12288, 2048), ("in_proj", 12352, 2048)]:
    x = torch.randn(4096, k, device="cuda", dtype=torch.bfloat16) * 0.1
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    r = torch.randn(4096, n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(4096, n, device="cuda", dtype=torch.bfloat16)
    a, b = [], []
    for _ in range(3):
        a.append(ms(lambda: torch.mm(x, w.t(), out=y)))
        b.append(ms(lambda: r.addmm_(x, w.t())))
    a, b = min(a), min(b)
    print(f"| {name} | {n} x {k} | {a:.4f} | {b:.4f} | {1e3 * (b - a):+.1f} | {2 * 4096 * n * k / a / 1e9:.0f} |")
PY
cat $L/beta_probe.md
cd $OUT && tar czf logs.tgz logs && rm -rf logs

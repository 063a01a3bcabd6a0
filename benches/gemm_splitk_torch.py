"""cuBLAS bf16 GEMMs at decode row counts (16, 32, 64 rows; the 1.39B model's and the Qwen3.5
layout's projection shapes), each timed as a CUDA graph over rotating weight copies that overflow
L2: one `x @ W.T` against split-K run as a strided batch over K slices and a sum (S = 2..8).
Prints a Markdown table of µs a call. Usage: gemm_splitk_torch.py [ROWS,ROWS,...]"""
import math, sys, torch
torch.manual_seed(0)
dev = "cuda"
shapes = [(2048, 6144), (2048, 4096), (2048, 2048), (2048, 5632), (2048, 3072), (12352, 2048), (12288, 2048), (9280, 2048), (11264, 2048)]
Ms = [int(m) for m in (sys.argv[1].split(",") if len(sys.argv) > 1 else ["16", "32", "64"])]
REP = 20

def graph_time(fn, reps=REP, outer=10):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3): fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps): fn(i)
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(outer):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / reps)
    ts.sort()
    return ts[len(ts) // 2]

print("| M | N × K | MB | one GEMM µs (TB/s) | " + " | ".join(f"split {s} µs" for s in (2, 3, 4, 6, 8)) + " |")
print("|---|---|---|---|" + "---|" * 5)
for m in Ms:
    for n, k in shapes:
        mb = n * k * 2 / 1e6
        copies = max(2, math.ceil(160e6 / (n * k * 2)))
        W = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        out = [None]
        def one(i):
            out[0] = x @ W[i % copies].t()
        t1 = graph_time(one)
        row = [f"{t1:.1f} ({mb / t1:.2f})"]
        for S in (2, 3, 4, 6, 8):
            if k % S or (k // S) % 64:
                row.append("–"); continue
            kc = k // S
            Ws = [w.view(n, S, kc).permute(1, 0, 2).contiguous() for w in W]
            xs = x.view(m, S, kc).permute(1, 0, 2).contiguous()
            def split(i):
                out[0] = torch.bmm(xs, Ws[i % copies].transpose(1, 2)).sum(0)
            row.append(f"{graph_time(split):.1f}")
            del Ws
        print(f"| {m} | {n} × {k} | {mb:.1f} | " + " | ".join(row) + " |", flush=True)
        del W
        torch.cuda.empty_cache()

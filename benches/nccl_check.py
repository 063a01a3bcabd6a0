"""Checks NCCL on this host the way deltaserve uses it: one process, one communicator per GPU,
every GPU's all-reduce queued together (PyTorch's torch.cuda.nccl, NCCL's grouped launch).

    python3 benches/nccl_check.py [GPUS]

Prints whether the GPUs can reach each other's memory, then one line per message size (bf16
elements): whether every GPU got the exact sum, and the time of the last of three.
"""
import sys
import threading
import time

import torch
import torch.cuda.nccl as nccl

n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else torch.cuda.device_count()
print(f"nccl {nccl.version()} on {n} GPUs: {[torch.cuda.get_device_name(i) for i in range(n)]}", flush=True)
for p in range(n):
    print(f"  peer access from cuda:{p}: {[torch.cuda.can_device_access_peer(p, q) for q in range(n) if q != p]}", flush=True)
for elems in [1 << 10, 1 << 16, 1 << 20, 1 << 23]:
    xs = [torch.full((elems,), float(r + 1), dtype=torch.bfloat16, device=f"cuda:{r}") for r in range(n)]
    want = float(n * (n + 1) // 2)
    for i in range(3):
        t = time.perf_counter()
        nccl.all_reduce(xs)
        for r in range(n):
            torch.cuda.synchronize(r)
        ms = (time.perf_counter() - t) * 1e3
        xs = [torch.full((elems,), float(r + 1), dtype=torch.bfloat16, device=f"cuda:{r}") for r in range(n)]
    nccl.all_reduce(xs)
    ok = all(bool((x == want).all()) for x in xs)
    print(f"all_reduce {elems} bf16: {'exact' if ok else 'WRONG'}, {ms:.3f} ms", flush=True)

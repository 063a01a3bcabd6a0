#!/usr/bin/env python3
"""Where fla's chunked Gated DeltaNet prefill spends its time: each kernel of
`chunk_gated_delta_rule` at the shapes of `gpu_bench`'s prefill mixer table, from torch.profiler
(GPU time per kernel, mean of 20 calls after 20 warm-up calls), beside our own launches timed by
Nsight Compute in the same device call.

    python3 benches/fla_kernels.py OUT.json      (needs torch and fla: PYTHONPATH with fla's wheels)

Inputs as benches/fla_mixer.py makes them: bf16 q/k/v (q, k L2-normalised), B sequences of T
tokens packed with `cu_seqlens`, fp32 initial state, final state out.
"""
import collections
import json
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from fla.ops.gated_delta_rule import chunk_gated_delta_rule

SHAPES = [(1, 4096, 16, 128, 256), (8, 2048, 16, 128, 256), (8, 2048, 16, 64, 256), (4, 8192, 16, 128, 256)]
CALLS = 20


def main(out):
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}}
    for b, t, h, k, v in SHAPES:
        torch.manual_seed(0)
        n = b * t
        q = F.normalize(torch.randn(1, n, h, k, device="cuda"), dim=-1).bfloat16()
        kk = F.normalize(torch.randn(1, n, h, k, device="cuda"), dim=-1).bfloat16()
        vv = torch.randn(1, n, h, v, device="cuda").bfloat16()
        beta = torch.rand(1, n, h, device="cuda").clamp_min(0.05).bfloat16()
        g = (-0.1 * torch.rand(1, n, h, device="cuda")).float()
        cu = torch.arange(0, (b + 1) * t, t, device="cuda", dtype=torch.long)
        h0 = torch.zeros(b, h, k, v, device="cuda")
        run = lambda: chunk_gated_delta_rule(q, kk, vv, g, beta, scale=k**-0.5, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        for _ in range(CALLS):
            run()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(CALLS):
                run()
            torch.cuda.synchronize()
        us = collections.defaultdict(float)
        for e in p.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                us[e.name] += e.device_time / CALLS
        key = f"B={b} T={t} H={h} K={k} V={v}"
        res["shapes"][key] = dict(us)
        print(f"{key}: {sum(us.values()):.1f} us of kernels a call")
        for name, x in sorted(us.items(), key=lambda kv: -kv[1]):
            print(f"  {x:8.1f} us  {name[:90]}")
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])

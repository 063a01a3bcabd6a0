#!/usr/bin/env python3
"""Times fla's own Gated DeltaNet kernels at the shapes of `gpu_bench`'s mixer tables, so that
its "vs fla" columns come from the same run (never from constants of another day).

    python3 benches/fla_mixer.py OUT.json        (needs torch, triton and fla: benches/mixer_vs_fla.sh)

Prefill: `chunk_gated_delta_rule`, B sequences of T tokens packed with `cu_seqlens`, bf16 q/k/v
(q, k L2-normalised), fp32 initial state, final state out. Decode: one token for each of B
sequences through `fused_recurrent_gated_delta_rule`, fp32 state in and out. Timed with
triton's `do_bench` (median; it clears the L2 with a 256 MB memset before each call), as
`docs/anchors.md` was.
"""
import json
import sys

import torch
import torch.nn.functional as F
import triton
from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

# The last two: the random 1.39B's heads (fla's 1.3B layout: 6 heads, K = 256, V = 512).
PREFILL = [
    (1, 4096, 16, 128, 256),
    (8, 2048, 16, 128, 256),
    (8, 2048, 16, 64, 256),
    (4, 8192, 16, 128, 256),
    (1, 4096, 6, 256, 512),
    (8, 2048, 6, 256, 512),
]
DECODE = [(b, 16, 128, 256) for b in (1, 8, 64, 256)]


def inputs(n, t, h, k, v):
    dev = "cuda"
    q = F.normalize(torch.randn(n, t, h, k, device=dev), dim=-1).bfloat16()
    kk = F.normalize(torch.randn(n, t, h, k, device=dev), dim=-1).bfloat16()
    vv = torch.randn(n, t, h, v, device=dev).bfloat16()
    beta = torch.rand(n, t, h, device=dev).clamp_min(0.05).bfloat16()
    g = (-0.1 * torch.rand(n, t, h, device=dev)).float()
    return q, kk, vv, g, beta


def save(res, out):
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


def main(out):
    """Writes OUT after every shape, so that a failure of fla's (an illegal address leaves the
    CUDA context unusable) keeps what was measured before it."""
    torch.manual_seed(0)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "prefill": [], "decode": []}
    try:
        import fla

        res["fla"] = fla.__version__
    except AttributeError:
        pass
    # Decode first: in fla 0.6.0 a decode of B=256 after the K = 256 prefill shapes in the same
    # process fails with an illegal address (2026-12-01, twice), leaving the context unusable.
    for b, h, k, v in DECODE:
        q, kk, vv, g, beta = inputs(b, 1, h, k, v)
        h0 = torch.zeros(b, h, k, v, device="cuda", dtype=torch.float32)
        run = lambda: fused_recurrent_gated_delta_rule(q, kk, vv, g, beta, scale=k**-0.5, initial_state=h0, output_final_state=True)
        ms = triton.testing.do_bench(run, warmup=25, rep=200, return_mode="median")
        res["decode"].append({"b": b, "h": h, "k": k, "v": v, "ms": ms})
        save(res, out)
        print(f"decode B={b}: {ms * 1e3:.1f} us", file=sys.stderr)
    for b, t, h, k, v in PREFILL:
        q, kk, vv, g, beta = inputs(1, b * t, h, k, v)
        cu = torch.arange(0, (b + 1) * t, t, device="cuda", dtype=torch.long)
        h0 = torch.zeros(b, h, k, v, device="cuda", dtype=torch.float32)
        run = lambda: chunk_gated_delta_rule(q, kk, vv, g, beta, scale=k**-0.5, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        ms = triton.testing.do_bench(run, warmup=25, rep=200, return_mode="median")
        res["prefill"].append({"b": b, "t": t, "h": h, "k": k, "v": v, "ms": ms})
        save(res, out)
        print(f"prefill B={b} T={t} H={h} K={k} V={v}: {ms:.3f} ms", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])

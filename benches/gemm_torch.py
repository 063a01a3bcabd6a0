"""PyTorch's F.linear on the 1.39B model's projection shapes (bf16), timed as gpu_bench
--gemm-only times ours: the mean of 50 back-to-back calls between two CUDA events after
warm-up. Prints one `GEMM {json}` line per shape and row count."""
import json

import torch
import torch.nn.functional as F

SHAPES = [("in_proj", 9228, 2048), ("o_proj", 2048, 3072), ("gate_up", 11264, 2048), ("down_proj", 2048, 5632)]
ROWS = [64, 256, 512, 2048, 4096]


def main():
    dev = torch.device("cuda")
    for name, n, k in SHAPES:
        w = (torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16)
        for m in ROWS:
            x = torch.randn(m, k, device=dev).to(torch.bfloat16)
            for _ in range(5):
                F.linear(x, w)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(50):
                F.linear(x, w)
            end.record()
            end.synchronize()
            us = start.elapsed_time(end) * 1e3 / 50
            line = {"name": name, "m": m, "n": n, "k": k, "path": "torch F.linear", "us": us, "tflops": 2 * m * n * k / us / 1e6}
            print("GEMM " + json.dumps(line), flush=True)


if __name__ == "__main__":
    main()

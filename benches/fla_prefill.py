#!/usr/bin/env python3
"""What a user would otherwise run for a long prompt: HF transformers + fla, one T-token forward
of an fla checkpoint (bf16, `logits_to_keep=1`, no cache), timed on the GPU, for the same-run
ratios of `gpu_bench --model-only` (its prefill T=4096 rows).

    python3 benches/fla_prefill.py MODEL_DIR OUT_JSON [T] [REPS]   (fla importable: benches/mixer_vs_fla.sh shows how)
"""
import json
import statistics
import sys

import fla  # noqa: F401  (registers fla's model types with transformers' Auto classes)
import torch
from transformers import AutoModelForCausalLM


def main(model_dir, out_json, t=4096, reps=10):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(10, model.config.vocab_size - 1, (1, t), generator=gen).cuda()
    times = []
    with torch.inference_mode():
        for i in range(reps + 3):  # three warm-ups compile and tune fla's triton kernels
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
            end.record()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(start.elapsed_time(end))
    ms = statistics.median(times)
    out = {"model": model_dir, "tokens": t, "median_ms": ms, "min_ms": min(times), "max_ms": max(times),
           "tokens_per_s": t / ms * 1e3, "torch": torch.__version__, "fla": getattr(fla, "__version__", "?")}
    json.dump(out, open(out_json, "w"), indent=1)
    print(f"HF transformers + fla, prefill T={t}: {ms:.2f} ms ({t / ms:.1f} k tokens/s), "
          f"min {min(times):.2f}, max {max(times):.2f}")


if __name__ == "__main__":
    a = sys.argv
    main(a[1], a[2], int(a[3]) if len(a) > 3 else 4096, int(a[4]) if len(a) > 4 else 10)

#!/usr/bin/env python3
"""What a user would otherwise run: transformers + fla generating with static batches, on the
checkpoint `benches/serving_sweep.sh` serves, the same work per request (512-token prompts,
256 new tokens, greedy, EOS ignored). One batch of each size (default 1, 8, 32, 64: at ~65 ms a
step, a size takes ~17 s, and larger ones do not fit the GPU call's time beside the sweep);
writes OUT_DIR/hf-static.json for benches/plot_serving.py.

    python3 benches/hf_static.py MODEL_DIR OUT_DIR [BATCHES...]     (fla importable: benches/mixer_vs_fla.sh shows how)
"""
import json
import sys
import time

import fla  # noqa: F401  (registers fla's model types with transformers' Auto classes)
import torch
import transformers
from transformers import AutoModelForCausalLM


def main(model_dir, out_dir, batches):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    gen = torch.Generator(device="cpu").manual_seed(0)
    points = []
    for b in batches:
        ids = torch.randint(10, 500, (b, 512), generator=gen).cuda()
        mask = torch.ones_like(ids)
        kw = dict(attention_mask=mask, do_sample=False, use_cache=True, pad_token_id=0)
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)  # warm-up (compiles fla's kernels)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
            torch.cuda.synchronize()
            ttft = time.perf_counter() - t0
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=256, min_new_tokens=256, **kw)
            torch.cuda.synchronize()
            total = time.perf_counter() - t0
        step = (total - ttft) / 255
        p = {"batch": b, "seconds": total, "output_throughput": b * 256 / total, "ttft_ms": ttft * 1e3, "step_ms": step * 1e3}
        points.append(p)
        print(json.dumps(p), flush=True)
        # Written after every batch: a time limit keeps the points so far.
        doc = {"label": "transformers + fla, static batches", "transformers": transformers.__version__, "torch": torch.__version__, "points": points}
        json.dump(doc, open(f"{out_dir}/hf-static.json", "w"), indent=1)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3:]] or [1, 8, 32, 64])

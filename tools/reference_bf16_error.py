#!/usr/bin/env python3
"""How far the reference library's own bf16 forward lands from its f32 goldens, per case, for
the compact transformers fixtures: the yardstick for our bf16 tolerance on each family.

    python3 tools/reference_bf16_error.py [--write] tests/fixtures/compact/olmo_hybrid ...

Loads each checkpoint with transformers in bf16 (its default SDPA/torch paths), prefills every
golden prompt and prints ‖logits_bf16 − logits_f32‖ / ‖logits_f32‖ for the last position, the
measure tests/gpu.rs applies to ours. `--write` stores them in the goldens as
`reference_bf16_last_rel_err` (one per case), where tests/gpu.rs reads them as the bf16 bound
of the MoE fixtures (whose routing can flip in bf16, in the reference as in ours).
"""

import json
import sys

import torch
from safetensors.torch import load_file


def main():
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    write = "--write" in sys.argv[1:]
    for d in [a for a in sys.argv[1:] if a != "--write"]:
        name = d.rstrip("/").split("/")[-1]
        cases = json.load(open(f"{d}.goldens.json"))["cases"]
        ref = load_file(f"{d}.logits.safetensors")
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).cuda().eval()
        errs = []
        with torch.inference_mode():
            for i, c in enumerate(cases):
                ids = torch.tensor([c["input_ids"]], device="cuda")
                got = model(input_ids=ids).logits[0, -1].float().cpu()
                want = ref[f"case{i}.last_logits"].float()
                errs.append(((got - want).norm() / want.norm()).item())
        print(name, "transformers bf16 vs its f32 goldens:", " ".join(f"{e:.2e}" for e in errs), flush=True)
        if write:
            g = json.load(open(f"{d}.goldens.json"))
            g["reference_bf16_last_rel_err"] = [round(e, 6) for e in errs]
            json.dump(g, open(f"{d}.goldens.json", "w"), indent=1)


if __name__ == "__main__":
    main()

"""Goldens of a reference model, shared by the fixture scripts: per prompt its ids, the logits
after the last token (all positions for prompts over 100 tokens), and a greedy continuation with
each step's top-2 margin, every step recomputing the whole sequence (no cache)."""

import json
import math
import os

import torch
from safetensors.torch import save_file


def reference_setup(out_dir):
    """TF32 off (f32 truths); the compact GDN fixture's tokenizer and prompts, which every
    fixture shares. Returns (tokenizer directory, tokenizer, [(prompt, ids)])."""
    from tokenizers import Tokenizer

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    src = os.path.join(out_dir, "gdn")
    tok = Tokenizer.from_file(os.path.join(src, "tokenizer.json"))
    cases = json.load(open(os.path.join(out_dir, "gdn.goldens.json")))["cases"]
    return src, tok, [(c["prompt"], c["input_ids"]) for c in cases]


@torch.no_grad()
def logits_of(model, ids):
    out = model(input_ids=torch.tensor([ids], device="cuda"), use_cache=False)
    return out.logits[0].double().cpu()


def write_goldens(name, model, prompts, tok, out_dir, reference, steps):
    """Writes `NAME.goldens.json` and `NAME.logits.safetensors` into `out_dir`."""
    cases, tensors = [], {}
    for c, (prompt, ids) in enumerate(prompts):
        all_logits = logits_of(model, ids)
        tensors[f"case{c}.input_ids"] = torch.tensor(ids, dtype=torch.int64)
        tensors[f"case{c}.last_logits"] = all_logits[-1].float().contiguous()
        if len(ids) > 100:
            tensors[f"case{c}.all_logits"] = all_logits.float().contiguous()
        seq, new, margins = list(ids), [], []
        last = all_logits[-1]
        for _ in range(steps):
            top = torch.topk(last, 2)
            new.append(int(top.indices[0]))
            margins.append(round(float(top.values[0] - top.values[1]), 6))
            seq.append(new[-1])
            last = logits_of(model, seq)[-1]
        cases.append(dict(prompt=prompt, input_ids=ids, greedy_new_ids=new,
                          greedy_text=tok.decode(new), top2_margins=margins))
        print(f"{name} case{c}: {len(ids)} tokens, margins min {min(margins):.4f} first {margins[:4]}", flush=True)
    json.dump(dict(model=name, reference=reference, cases=cases),
              open(os.path.join(out_dir, f"{name}.goldens.json"), "w"), indent=1)
    save_file(tensors, os.path.join(out_dir, f"{name}.logits.safetensors"))


def zero_centred(lib, name):
    """Qwen's decoder RMSNorms store w with y = x̂·(1 + w) (zero init)."""
    if lib != "qwen3_5":
        return False
    return name.endswith("layernorm.weight") or ".q_norm." in name or ".k_norm." in name or name.endswith("language_model.norm.weight")


def redraw(model, seed, lib, d):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if "visual" in name:
                p.copy_(0.02 * r)
            elif name.endswith("bias") and "dt_bias" not in name:
                p.copy_(0.3 * r)
            elif p.dim() == 1 and zero_centred(lib, name):
                p.copy_(0.3 * r)
            elif p.dim() == 1:  # plain norm weights, A_log, dt_bias
                p.copy_(1.0 + 0.3 * r)
            elif "conv1d" in name:
                p.copy_(0.6 * r)
            elif "embed" in name:
                p.copy_(r)
            elif "lm_head" in name:
                p.copy_(3.0 * r / math.sqrt(d))
            else:
                p.copy_(r / math.sqrt(p.shape[-1]))

#!/usr/bin/env python3
"""Makes compact test fixtures with fla itself: a tiny random-init checkpoint per config, saved by
fla's `save_pretrained` (f32 weights), with goldens from fla's own forward.

Run on a GPU host with fla's wheels (flash-linear-attention, fla-core 0.6.0) importable:

    python3 tools/make_fla_fixtures.py --out tests/fixtures/compact

Weights: fla's initialisation gives near-uniform logits, so every weight is redrawn large (norm
weights and conv filters random too), which gives real top-2 margins and lets a misapplied norm
weight or conv tap show up. Goldens: TF32 off and every linear-attention layer in fla's
`fused_recurrent` mode (plain fp32; fla's chunk kernels use TF32 even for fp32 inputs), so they
are f32 truths. Greedy continuations recompute the whole sequence each step (no cache).
Prompts (token ids; the last is 130 tokens, past a 64-token chunk) and the 512-token tokenizer
are those of the compact GDN fixture.
"""

import argparse
import os
import shutil

import torch

from fixture_goldens import redraw, reference_setup, write_goldens

# name -> fla config fields (beyond the shared ones below)
CONFIGS = {
    # fla's DeltaNet defaults for the mixer: silu + l2, β from b_proj, ungated RMSNorm output.
    "delta_net": dict(model_type="delta_net", expand_k=1.0, expand_v=1.5, use_gate=False,
                      use_beta=True, qk_activation="silu", qk_norm="l2", allow_neg_eigval=False),
    # The other paths: gated output, relu + L1 ("sum") normalisation, no β (≡ 2 with neg eigvals),
    # expand_k 0.5 (K=16 < V=64).
    "delta_net-gated": dict(model_type="delta_net", expand_k=0.5, expand_v=2.0, use_gate=True,
                            use_beta=False, qk_activation="relu", qk_norm="sum", allow_neg_eigval=True),
}
SHARED = dict(hidden_size=64, num_heads=2, num_hidden_layers=2, intermediate_size=192, conv_size=4,
              vocab_size=512, bos_token_id=1, eos_token_id=2, norm_eps=1e-6, tie_word_embeddings=False,
              max_position_embeddings=4096, use_short_conv=True, fuse_norm=True, fuse_swiglu=True)
STEPS = 16


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/compact")
    ap.add_argument("--only", default=",".join(CONFIGS))
    a = ap.parse_args()
    import fla  # noqa: F401  (registers fla's model types with transformers)
    from transformers import AutoConfig, AutoModelForCausalLM
    src, tok, prompts = reference_setup(a.out)
    for i, name in enumerate(a.only.split(",")):
        fields = dict(SHARED, **CONFIGS[name])
        cfg = AutoConfig.for_model(**fields)
        torch.manual_seed(100 + i)
        model = AutoModelForCausalLM.from_config(cfg).float()
        redraw(model, 1000 + i, "fla", model.config.hidden_size)
        model = model.cuda().eval()
        for layer in model.model.layers:
            if hasattr(layer.attn, "mode"):
                layer.attn.mode = "fused_recurrent"
        out = os.path.join(a.out, name)
        os.makedirs(out, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(src, f), out)
        reference = f"fla {fla.__version__}, torch {torch.__version__}, f32, TF32 off, fused_recurrent, full recomputation per greedy step"
        write_goldens(name, model, prompts, tok, a.out, reference, STEPS)


if __name__ == "__main__":
    main()

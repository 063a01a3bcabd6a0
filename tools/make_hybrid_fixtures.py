#!/usr/bin/env python3
"""Makes compact hybrid-model fixtures with each family's own library: a tiny random-init
checkpoint saved by that library's `save_pretrained` (f32 weights), with goldens from its own
forward.

    # fla's attention hybrids (fla wheels on PYTHONPATH):
    python3 tools/make_hybrid_fixtures.py --lib fla --out tests/fixtures/compact
    # Qwen3.5 and OLMo-Hybrid (transformers only; fla must NOT be importable, so that HF runs
    # its own torch paths instead of fla's kernels):
    python3 tools/make_hybrid_fixtures.py --lib hf --out tests/fixtures/compact
    # The mixture-of-experts hybrids, Qwen3-Next and Qwen3.5-MoE (transformers only, as above):
    python3 tools/make_hybrid_fixtures.py --lib hf-moe --out tests/fixtures/compact

Weights are redrawn large (norm weights, conv filters and biases random too) so that greedy
margins are real and a misapplied weight shows up. Goldens: f32, TF32 off, no cache (every greedy
step recomputes the whole sequence); fla's linear layers in `fused_recurrent` mode (its chunk
kernels use TF32 even for f32). fla's softmax attention calls flash-attn, which the GPU host does
not have: a float64 torch stand-in with flash-attn's causal / sliding-window semantics
(`window_size = (w-1, 0)`: a query sees itself and the w-1 keys before it) takes its place; the
projections, RoPE and layer wiring are fla's own. Prompts and the 512-token tokenizer are those
of the compact GDN fixture; a 200-token prompt is added (past a 64-token chunk and past every
sliding window).
"""

import argparse
import json
import os
import shutil
import sys
import types

import torch

from fixture_goldens import logits_of, redraw, reference_setup, write_goldens

STEPS = 32
# Qwen3.5's vision tower, tiny: the checkpoints carry one so that skipping it is tested.
TINY_VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4, spatial_merge_size=2,
                   temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=16)


def fake_flash_attn():
    """A torch stand-in for flash-attn's dense entry point (float64 inside)."""

    def flash_attn_func(q, k, v, causal=True, window_size=(-1, -1), softmax_scale=None, **_):
        b, t, hq, d = q.shape
        s, hkv = k.shape[1], k.shape[2]
        scale = softmax_scale if softmax_scale is not None else d ** -0.5
        qq, kk, vv = q.double(), k.double(), v.double()
        g = hq // hkv
        kk = kk.repeat_interleave(g, dim=2)
        vv = vv.repeat_interleave(g, dim=2)
        scores = torch.einsum("bthd,bshd->bhts", qq, kk) * scale
        i = torch.arange(t, device=q.device)[:, None] + (s - t)
        j = torch.arange(s, device=q.device)[None, :]
        visible = j <= i if causal else torch.ones_like(j <= i)
        if window_size[0] >= 0:
            visible = visible & (j >= i - window_size[0])
        scores = scores.masked_fill(~visible, float("-inf"))
        p = torch.softmax(scores, dim=-1)
        return torch.einsum("bhts,bshd->bthd", p, vv).to(q.dtype)

    def flash_attn_varlen_func(*_a, **_k):
        raise RuntimeError("varlen path not expected: the goldens run one unpadded sequence")

    m = types.ModuleType("flash_attn")
    m.flash_attn_func = flash_attn_func
    m.flash_attn_varlen_func = flash_attn_varlen_func
    sys.modules["flash_attn"] = m


def fla_models():
    import fla  # noqa: F401  (registers fla's model types)
    from transformers import AutoConfig, AutoModelForCausalLM

    shared = dict(hidden_size=64, num_heads=2, num_hidden_layers=4, intermediate_size=192, conv_size=4,
                  vocab_size=512, bos_token_id=1, eos_token_id=2, norm_eps=1e-6, tie_word_embeddings=False,
                  max_position_embeddings=4096, use_short_conv=True, fuse_norm=True, fuse_swiglu=True)
    # Layer 1: sliding window 32, GQA 4:2, q/k/v biases; layer 3: full causal MHA.
    attn = [dict(layers=[1], num_heads=4, num_kv_heads=2, qkv_bias=True, window_size=32, rope_theta=10000.0),
            dict(layers=[3], num_heads=4, num_kv_heads=4, qkv_bias=False, window_size=None, rope_theta=500000.0)]
    configs = {
        "gdn-attn": dict(model_type="gated_deltanet", head_dim=32, expand_v=1.5, num_v_heads=4, use_gate=True, attn=attn),
    }
    for i, (name, fields) in enumerate(configs.items()):
        cfg = AutoConfig.for_model(**dict(shared, **fields))
        torch.manual_seed(200 + i)
        model = AutoModelForCausalLM.from_config(cfg).float()
        redraw(model, 2000 + i, "fla", 64)
        model = model.cuda().eval()
        for layer in model.model.layers:
            if hasattr(layer.attn, "mode"):
                layer.attn.mode = "fused_recurrent"
        yield name, model, f"fla {fla.__version__}"


def hf_models():
    import transformers
    from transformers import AutoModelForCausalLM

    ver = f"transformers {transformers.__version__}"
    # Qwen3.5 as released: the multimodal wrapper with a (tiny) vision tower beside the text model.
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    text = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                max_position_embeddings=4096, linear_conv_kernel_dim=4, linear_key_head_dim=16,
                linear_value_head_dim=24, linear_num_key_heads=2, linear_num_value_heads=4,
                layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
                rope_parameters=dict(rope_type="default", rope_theta=1000000.0, partial_rotary_factor=0.25,
                                     mrope_section=[1, 1, 2], mrope_interleaved=True),
                bos_token_id=None, eos_token_id=2, pad_token_id=None, tie_word_embeddings=False)
    cfg = Qwen3_5Config(text_config=text, vision_config=TINY_VISION, tie_word_embeddings=False)
    torch.manual_seed(300)
    model = Qwen3_5ForConditionalGeneration._from_config(cfg, attn_implementation="eager").float()
    redraw(model, 3000, "qwen3_5", 64)
    yield "qwen3_5", model.cuda().eval(), ver

    from transformers import OlmoHybridConfig
    for i, (name, rope) in enumerate([("olmo_hybrid", None), ("olmo_hybrid-rope", dict(rope_type="default", rope_theta=10000.0))]):
        cfg = OlmoHybridConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                               pad_token_id=0, bos_token_id=1, eos_token_id=2, rope_parameters=rope,
                               layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
                               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                               linear_value_head_dim=24, linear_conv_kernel_dim=4, linear_allow_neg_eigval=True)
        if rope is None:
            cfg.rope_parameters = None
        torch.manual_seed(400 + i)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float()
        rot = getattr(model.model, "rotary_emb", None)
        print(f"{name}: rotary_emb = {type(rot).__name__ if rot is not None else None}", flush=True)
        redraw(model, 4000 + i, "olmo", 64)
        yield name, model.cuda().eval(), ver


MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
# Layer 0 of each MoE fixture: experts 3 and 5 get the same router row, so their router logits
# tie exactly for every token; the goldens then hold the reference's tie-break wherever the
# top-k boundary falls between them.
TIED = (3, 5)


def tie_router(model):
    router = next(m for n, m in model.named_modules() if n.endswith("layers.0.mlp.gate"))
    with torch.no_grad():
        router.weight[TIED[1]].copy_(router.weight[TIED[0]])
    return router


def hf_moe_models():
    import transformers

    ver = f"transformers {transformers.__version__}"
    text = dict(vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=4096, linear_conv_kernel_dim=4,
                linear_key_head_dim=16, linear_value_head_dim=24, linear_num_key_heads=2, linear_num_value_heads=4,
                layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
                bos_token_id=None, eos_token_id=2, pad_token_id=None, tie_word_embeddings=False, **MOE)
    # Qwen3-Next: text-only, packed in_proj_qkvz / in_proj_ba, one dense MLP layer (2).
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    cfg = Qwen3NextConfig(intermediate_size=128, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[2],
                          rope_parameters=dict(rope_type="default", rope_theta=1000000.0, partial_rotary_factor=0.25),
                          **text)
    torch.manual_seed(500)
    model = Qwen3NextForCausalLM._from_config(cfg, attn_implementation="eager").float()
    redraw(model, 5000, "qwen3_5", 64)
    tie_router(model)
    yield "qwen3_next", model.cuda().eval(), ver
    # Qwen3.5-MoE as released: the multimodal wrapper, every layer MoE, packed experts.
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration
    text = dict(text, rope_parameters=dict(rope_type="default", rope_theta=1000000.0, partial_rotary_factor=0.25,
                                           mrope_section=[1, 1, 2], mrope_interleaved=True))
    cfg = Qwen3_5MoeConfig(text_config=text, vision_config=TINY_VISION, tie_word_embeddings=False)
    torch.manual_seed(600)
    model = Qwen3_5MoeForConditionalGeneration._from_config(cfg, attn_implementation="eager").float()
    redraw(model, 6000, "qwen3_5", 64)
    tie_router(model)
    yield "qwen3_5_moe", model.cuda().eval(), ver


@torch.no_grad()
def pack_experts(model, out, ids):
    """transformers 5.17 saves experts one by one; released checkpoints may hold them packed
    (`experts.gate_up_proj` [E, 2I, D], `experts.down_proj` [E, D, I], transformers' in-memory
    form). Rewrites the checkpoint in that packed form, and checks that transformers loads it
    back to the same logits."""
    from safetensors.torch import save_file
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    assert any(k.endswith("experts.gate_up_proj") for k in state), "in-memory experts are not packed"
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    again = type(model).from_pretrained(out, attn_implementation="eager", dtype=torch.float32).cuda().eval()
    diff = (logits_of(again, ids) - logits_of(model, ids)).abs().max().item()
    assert diff == 0.0, f"packed checkpoint reloads {diff} away"
    print(f"packed experts written; transformers reloads them to identical logits", flush=True)


@torch.no_grad()
def routing_of(model, ids, k):
    """Layer 0's chosen experts per token, read from the reference's own router output (or
    from its router logits with the reference's softmax + torch.topk when the router module
    returns logits only), and how many tokens had the tie at the top-k boundary."""
    router = next(m for n, m in model.named_modules() if n.endswith("layers.0.mlp.gate"))
    seen = {}
    h = router.register_forward_hook(lambda _m, _i, out: seen.setdefault("out", out))
    model(input_ids=torch.tensor([ids], device="cuda"), use_cache=False)
    h.remove()
    out = seen["out"]
    if isinstance(out, tuple):
        logits, idx = out[0], out[-1]
    else:
        logits = out
        idx = torch.topk(torch.softmax(logits.float(), dim=-1), k, dim=-1).indices
    p = torch.softmax(logits.float(), dim=-1)
    a, b = TIED
    kth = torch.topk(p, k + 1, dim=-1).values
    boundary = ((p[:, a] == p[:, b]) & (p[:, a] == kth[:, k - 1]) & (kth[:, k - 1] == kth[:, k])).sum().item()
    return idx.reshape(len(ids), k).tolist(), int(boundary)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/compact")
    ap.add_argument("--lib", choices=["fla", "hf", "hf-moe"], required=True)
    a = ap.parse_args()
    src, tok, prompts = reference_setup(a.out)
    # One prompt past every window and chunk: the long case repeated with its head cut off.
    long_ids = (prompts[-1][1] + prompts[-1][1][1:])[:200]
    prompts.append((tok.decode(long_ids), long_ids))
    if a.lib == "fla":
        # transformers probes for flash-attn at import; let it find none before the stand-in exists.
        import transformers.activations  # noqa: F401
        fake_flash_attn()
        models = fla_models()
    elif a.lib == "hf-moe":
        models = hf_moe_models()
    else:
        models = hf_models()
    for name, model, ver in models:
        out = os.path.join(a.out, name)
        os.makedirs(out, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(src, f), out)
        if name in ("qwen3_5", "qwen3_5_moe", "qwen3_next"):
            # Released Qwen checkpoints list several stop ids here.
            json.dump(dict(eos_token_id=[2, 5], bos_token_id=None, do_sample=False), open(os.path.join(out, "generation_config.json"), "w"), indent=1)
        print(name, "keys:", sorted({k.rsplit(".", 2)[0] for k in __import__("safetensors.torch", fromlist=["load_file"]).load_file(os.path.join(out, "model.safetensors")).keys()})[:80], flush=True)
        if name == "qwen3_5_moe":
            pack_experts(model, out, prompts[0][1])
        if a.lib == "hf-moe":
            from safetensors import safe_open
            with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
                for k in sorted(f.keys()):
                    if ".layers.0." in k or ".layers.2." in k:
                        print(f"  {k} {list(f.get_slice(k).get_shape())}", flush=True)
        reference = f"{ver}, torch {torch.__version__}, f32, TF32 off, no cache, full recomputation per greedy step"
        write_goldens(name, model, prompts, tok, a.out, reference, STEPS)
        if a.lib == "hf-moe":
            path = os.path.join(a.out, f"{name}.goldens.json")
            g = json.load(open(path))
            ids = prompts[-1][1]
            route, ties = routing_of(model, ids, MOE["num_experts_per_tok"])
            g["layer0_routing"] = dict(tied_experts=list(TIED), case=len(prompts) - 1, boundary_ties=ties, experts=route)
            json.dump(g, open(path, "w"), indent=1)
            print(f"{name}: layer 0 top-k boundary ties between experts {TIED}: {ties} of {len(ids)} tokens", flush=True)


if __name__ == "__main__":
    main()

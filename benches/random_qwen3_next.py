"""Writes a random bf16 checkpoint of a Qwen3-Next config (Qwen3-Next-80B-A3B's shapes by
default: 160 GB) quickly, for the tensor parallel benchmark: the tensors transformers' Qwen3-Next
reads, with the experts of a layer packed (`mlp.experts.gate_up_proj` [E, 2I, D],
`mlp.experts.down_proj` [E, D, I]), drawn on the GPU and saved as sharded safetensors with an
index. Values are scaled normals (1/sqrt(fan-in)), norms near 0 (Qwen's norms are x̂·(1 + w)),
A_log = log U(1, 16), as the reference initialises them; the text is meaningless.

    python3 random_qwen3_next.py CONFIG OUT_DIR --part K --parts N   # shard writers, one per GPU
    python3 random_qwen3_next.py CONFIG OUT_DIR --index              # config.json and the index

With `--spill DIR --keep-bytes B`, the shards past the first B bytes are written to DIR and
linked from OUT_DIR (a host whose /dev/shm cannot hold the whole checkpoint).
"""
import argparse
import json
import math
import os

import torch
from safetensors.torch import save_file


def tensors(c):
    """(name, shape) of every tensor, in layer order."""
    d, v = c["hidden_size"], c["vocab_size"]
    hk, hv, dk, dv = c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"], c["linear_value_head_dim"]
    h, kvh, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    e, i, si = c["num_experts"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    out = [("model.embed_tokens.weight", [v, d])]
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out += [(p + "input_layernorm.weight", [d]), (p + "post_attention_layernorm.weight", [d])]
        if (n + 1) % c["full_attention_interval"] == 0:
            a = p + "self_attn."
            out += [(a + "q_proj.weight", [2 * h * hd, d]), (a + "k_proj.weight", [kvh * hd, d]), (a + "v_proj.weight", [kvh * hd, d]),
                    (a + "o_proj.weight", [d, h * hd]), (a + "q_norm.weight", [hd]), (a + "k_norm.weight", [hd])]
        else:
            a = p + "linear_attn."
            out += [(a + "in_proj_qkvz.weight", [2 * hk * dk + 2 * hv * dv, d]), (a + "in_proj_ba.weight", [2 * hv, d]),
                    (a + "conv1d.weight", [2 * hk * dk + hv * dv, 1, c["linear_conv_kernel_dim"]]), (a + "A_log", [hv]),
                    (a + "dt_bias", [hv]), (a + "norm.weight", [dv]), (a + "out_proj.weight", [d, hv * dv])]
        m = p + "mlp."
        out += [(m + "gate.weight", [e, d]), (m + "experts.gate_up_proj", [e, 2 * i, d]), (m + "experts.down_proj", [e, d, i]),
                (m + "shared_expert.gate_proj.weight", [si, d]), (m + "shared_expert.up_proj.weight", [si, d]),
                (m + "shared_expert.down_proj.weight", [d, si]), (m + "shared_expert_gate.weight", [1, d])]
    return out + [("model.norm.weight", [d]), ("lm_head.weight", [v, d])]


def shards(c, limit=8 << 30):
    """Tensors grouped into shards of at most `limit` bytes (bf16)."""
    groups, cur, size = [], [], 0
    for name, shape in tensors(c):
        b = 2 * math.prod(shape)
        if cur and size + b > limit:
            groups.append(cur)
            cur, size = [], 0
        cur.append((name, shape))
        size += b
    return groups + [cur]


def value(name, shape, dev):
    if name.endswith("A_log"):
        return torch.empty(shape, device=dev).uniform_(1, 16).log()
    if name.endswith("dt_bias"):
        return torch.randn(shape, device=dev) * 0.5 - 2
    if name.endswith("linear_attn.norm.weight"):
        return 1 + torch.randn(shape, device=dev) * 0.1
    if "norm" in name:
        return torch.randn(shape, device=dev) * 0.1
    fan_in = shape[-1]
    return torch.randn(shape, device=dev, dtype=torch.bfloat16) / math.sqrt(fan_in)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--part", type=int, default=0)
    ap.add_argument("--parts", type=int, default=1)
    ap.add_argument("--index", action="store_true")
    ap.add_argument("--spill", help="directory for the shards past --keep-bytes")
    ap.add_argument("--keep-bytes", type=int, default=0)
    a = ap.parse_args()
    c = json.load(open(a.config))
    groups = shards(c)
    names = [f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors" for k in range(len(groups))]
    os.makedirs(a.out, exist_ok=True)
    if a.index:
        json.dump(c, open(os.path.join(a.out, "config.json"), "w"), indent=1)
        weight_map = {n: names[k] for k, g in enumerate(groups) for n, _ in g}
        total = sum(2 * math.prod(s) for _, s in tensors(c))
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, open(os.path.join(a.out, "model.safetensors.index.json"), "w"))
        print(f"{len(weight_map)} tensors, {total / 1e9:.1f} GB in {len(groups)} shards")
        return
    dev = f"cuda:{a.part % max(torch.cuda.device_count(), 1)}"
    torch.manual_seed(a.part)
    end = 0
    ends = []
    for g in groups:
        end += sum(2 * math.prod(s) for _, s in g)
        ends.append(end)
    for k in range(a.part, len(groups), a.parts):
        t = {n: value(n, s, dev).to(torch.bfloat16).cpu() for n, s in groups[k]}
        path = os.path.join(a.out, names[k])
        if a.spill and ends[k] > a.keep_bytes:
            os.makedirs(a.spill, exist_ok=True)
            save_file(t, os.path.join(a.spill, names[k]))
            if not os.path.lexists(path):
                os.symlink(os.path.join(a.spill, names[k]), path)
        else:
            save_file(t, path)


if __name__ == "__main__":
    main()

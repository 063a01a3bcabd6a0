#!/usr/bin/env python3
"""Train deltaserve's small demo models and export them in fla's exact checkpoint layout.

Our own plain-PyTorch implementation of fla's Gated DeltaNet and Gated DeltaProduct
(docs/model-spec.md in the shared references): short conv + SiLU, l2norm, beta, the fp32 gate
-exp(A_log)*softplus(a+dt_bias), the chunkwise gated delta rule (chunk 64, WY/UT form with a
triangular solve, differentiable), gated RMSNorm, SwiGLU MLP. Gated DeltaProduct runs the same
rule on the interleaved sequence (gate on each token's first householder step, q on its last).

Steps: build a corpus from Python's standard library, leaving out every file whose text
appears in the held-out file; train a 4096-token byte-level BPE; train each model for a time
budget; export config.json, model.safetensors (bf16), tokenizer files and generation_config;
and dump f32 logits of the exported weights for a parity test in deltaserve.

Run on a GPU host:  python3 tools/train_demo.py --heldout heldout.txt --out models --minutes 3.5
"""

import argparse
import sys
import json
import math
import os
import time

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

CHUNK = 64
VOCAB = 4096
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}# {{ m['role'] }}:\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}# assistant:\n{% endif %}"
)


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from demo_corpus import build_corpus  # noqa: E402  (no torch needed there)


def train_tokenizer(files, out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(files, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="$A $B", special_tokens=[("<s>", 1)])
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    return tok


# ----------------------------------------------------------------------------- model

def rms_norm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def l2norm(x):
    return x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


def chunk_gated_delta_rule(q, k, v, beta, g, scale):
    """q,k [B,T,H,K] (normalised), v [B,T,H,V], beta,g [B,T,H]; fp32. Returns o [B,T,H,V]."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    pad = (CHUNK - T % CHUNK) % CHUNK
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
        beta, g = (F.pad(x, (0, 0, 0, pad)) for x in (beta, g))
    N = (T + pad) // CHUNK
    # [B,H,N,C,*]
    q, k, v = (x.transpose(1, 2).reshape(B, H, N, CHUNK, -1) for x in (q, k, v))
    beta, g = (x.transpose(1, 2).reshape(B, H, N, CHUNK) for x in (beta, g))
    q = q * scale
    gamma = g.cumsum(-1)
    diff = gamma[..., :, None] - gamma[..., None, :]
    lower_incl = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    strict = lower_incl.clone().fill_diagonal_(False)
    # Mask before exp: the upper triangle would overflow.
    decay = torch.exp(diff.masked_fill(~lower_incl, -float("inf")))
    A = (beta[..., :, None] * (k @ k.transpose(-1, -2)) * decay).masked_fill(~strict, 0.0)
    eye = torch.eye(CHUNK, device=q.device, dtype=q.dtype)
    Tm = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True)
    W = Tm @ (k * (beta * gamma.exp())[..., None])
    U = Tm @ (v * beta[..., None])
    S = q.new_zeros(B, H, K, V)
    outs = []
    for i in range(N):
        qi, ki, gi = q[:, :, i], k[:, :, i], gamma[:, :, i]
        v_new = U[:, :, i] - W[:, :, i] @ S
        attn = (qi @ ki.transpose(-1, -2)) * decay[:, :, i]
        outs.append((qi * gi.exp()[..., None]) @ S + attn @ v_new)
        last = gi[..., -1]
        S = S * last.exp()[..., None, None] + (ki * (last[..., None] - gi).exp()[..., None]).transpose(-1, -2) @ v_new
    o = torch.stack(outs, 2).reshape(B, H, N * CHUNK, V)[:, :, :T]
    return o.transpose(1, 2)


class Mixer(torch.nn.Module):
    """fla's GatedDeltaNet (n=1) or GatedDeltaProduct (n>1) layer, with fla's weight names."""

    def __init__(self, cfg):
        super().__init__()
        D, H, K = cfg["hidden_size"], cfg["num_heads"], cfg["head_dim"]
        Vd = int(K * cfg["expand_v"])
        n = cfg.get("num_householder", 1)
        self.n, self.H, self.K, self.Vd = n, H, K, Vd
        self.neg = cfg.get("allow_neg_eigval", False)
        self.product = cfg["model_type"] == "gated_deltaproduct"
        self.eps = cfg["norm_eps"]
        W = cfg["conv_size"]
        lin = lambda o, i: torch.nn.Linear(i, o, bias=False)
        self.q_proj, self.k_proj, self.v_proj = lin(H * K, D), lin(n * H * K, D), lin(n * H * Vd, D)
        self.b_proj, self.a_proj = lin(n * H, D), lin(H, D)
        A = torch.empty(H).uniform_(1, 16)
        self.A_log = torch.nn.Parameter(torch.log(A))
        dt = torch.exp(torch.rand(H) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
        self.dt_bias = torch.nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        conv = lambda c: torch.nn.Conv1d(c, c, W, groups=c, padding=W - 1, bias=False)
        self.q_conv1d, self.k_conv1d, self.v_conv1d = conv(H * K), conv(n * H * K), conv(n * H * Vd)
        self.g_proj = lin(H * Vd, D)
        self.o_norm = torch.nn.Module()
        self.o_norm.weight = torch.nn.Parameter(torch.ones(Vd))
        self.o_proj = lin(D, H * Vd)

    def conv(self, m, x):
        T = x.shape[1]
        return F.silu(m(x.transpose(1, 2))[..., :T].transpose(1, 2))

    def forward(self, x):
        B, T, _ = x.shape
        H, K, Vd, n = self.H, self.K, self.Vd, self.n
        q = self.conv(self.q_conv1d, self.q_proj(x)).float().reshape(B, T, H, K)
        k = self.conv(self.k_conv1d, self.k_proj(x)).float().reshape(B, T * n, H, K)
        v = self.conv(self.v_conv1d, self.v_proj(x)).float().reshape(B, T * n, H, Vd)
        bl = self.b_proj(x)
        # GDP computes sigmoid in the activation dtype inside the layer; GDN in fp32.
        beta = (bl.sigmoid() if self.product else bl.float().sigmoid()).float().view(B, T * n, H)
        if self.neg:
            beta = beta * 2.0
        g = -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias.float())
        q, k = l2norm(q), l2norm(k)
        if n > 1:
            qi = q.new_zeros(B, T, n, H, K)
            qi[:, :, -1] = q
            gi = g.new_zeros(B, T, n, H)
            gi[:, :, 0] = g
            q, g = qi.view(B, T * n, H, K), gi.view(B, T * n, H)
        o = chunk_gated_delta_rule(q, k, v, beta, g, K ** -0.5)
        if n > 1:
            o = o.view(B, T, n, H, Vd)[:, :, -1]
        z = self.g_proj(x).float().view(B, T, H, Vd)
        y = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps) * self.o_norm.weight.float()
        y = (y * F.silu(z)).to(x.dtype).reshape(B, T, H * Vd)
        return self.o_proj(y)


class Norm(torch.nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class Mlp(torch.nn.Module):
    def __init__(self, d, i):
        super().__init__()
        self.gate_proj = torch.nn.Linear(d, i, bias=False)
        self.up_proj = torch.nn.Linear(d, i, bias=False)
        self.down_proj = torch.nn.Linear(i, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(torch.nn.Module):
    def __init__(self, cfg, i_size):
        super().__init__()
        D, eps = cfg["hidden_size"], cfg["norm_eps"]
        self.attn_norm, self.attn = Norm(D, eps), Mixer(cfg)
        self.mlp_norm, self.mlp = Norm(D, eps), Mlp(D, i_size)

    def forward(self, h):
        r = h + self.attn(self.attn_norm(h))
        return r + self.mlp(self.mlp_norm(r))


class CausalLm(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        D = cfg["hidden_size"]
        i_size = cfg.get("intermediate_size") or 256 * math.ceil(int(D * cfg["hidden_ratio"] * 2 / 3) / 256)
        self.model = torch.nn.Module()
        self.model.embeddings = torch.nn.Embedding(cfg["vocab_size"], D)
        self.model.layers = torch.nn.ModuleList(Block(cfg, i_size) for _ in range(cfg["num_hidden_layers"]))
        self.model.norm = Norm(D, cfg["norm_eps"])
        self.lm_head = torch.nn.Linear(D, cfg["vocab_size"], bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2 and "embeddings" not in name:
                torch.nn.init.normal_(p, std=0.02)
        torch.nn.init.normal_(self.model.embeddings.weight, std=0.02)

    def forward(self, ids):
        h = self.model.embeddings(ids)
        for b in self.model.layers:
            h = b(h)
        return self.lm_head(self.model.norm(h))


# ----------------------------------------------------------------------------- train / export

def fla_config(kind):
    common = dict(hidden_size=256, num_hidden_layers=6, num_heads=4, head_dim=64, expand_v=2.0,
                  conv_size=4, use_short_conv=True, hidden_ratio=4, intermediate_size=None,
                  hidden_act="swish", norm_eps=1e-6, vocab_size=VOCAB, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2, pad_token_id=None, attn=None, attn_mode="chunk",
                  attnres_block_size=None, max_position_embeddings=2048, fuse_norm=True, fuse_swiglu=True,
                  fuse_cross_entropy=True, fuse_linear_cross_entropy=False, use_l2warp=False,
                  initializer_range=0.02, use_cache=True, transformers_version="5.17.0")
    if kind == "gdn":
        return dict(common, model_type="gated_deltanet", architectures=["GatedDeltaNetForCausalLM"],
                    num_v_heads=None, use_gate=True, allow_neg_eigval=False, output_gate_activation="swish")
    return dict(common, model_type="gated_deltaproduct", architectures=["GatedDeltaProductForCausalLM"],
                num_householder=2, allow_neg_eigval=True, use_forget_gate=True, use_output_gate=True)


def export(model, cfg, tok_dir, out):
    os.makedirs(out, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()}
    # fla's conv weights are [C, 1, W]: nn.Conv1d's layout already.
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    json.dump(dict(cfg, dtype="bfloat16"), open(os.path.join(out, "config.json"), "w"), indent=2, sort_keys=True)
    json.dump({"bos_token_id": 1, "eos_token_id": 2}, open(os.path.join(out, "generation_config.json"), "w"), indent=2)
    json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
               "model_max_length": 1000000, "tokenizer_class": "PreTrainedTokenizerFast",
               "chat_template": CHAT_TEMPLATE}, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)
    with open(os.path.join(tok_dir, "tokenizer.json")) as f, open(os.path.join(out, "tokenizer.json"), "w") as g:
        g.write(f.read())
    return sd


def train(kind, ids, cfg, minutes, dev, seq_len, batch):
    torch.manual_seed(0)
    model = CausalLm(cfg).to(dev)
    params = sum(p.numel() for p in model.parameters())
    print(f"{kind}: {params/1e6:.2f} M parameters", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    other = [p for n, p in model.named_parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=2e-3, betas=(0.9, 0.95), fused=dev == "cuda")
    data = torch.tensor(ids, dtype=torch.long)
    budget = minutes * 60
    start = time.time()
    step, warm = 0, 100
    est_steps = None
    while True:
        el = time.time() - start
        if el > budget:
            break
        # Cosine schedule on elapsed time, so the run fits its budget.
        frac = min(1.0, el / budget)
        lr = 2e-3 * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        starts = torch.randint(0, len(data) - seq_len - 1, (batch,))
        x = torch.stack([data[s:s + seq_len] for s in starts]).to(dev)
        y = torch.stack([data[s + 1:s + seq_len + 1] for s in starts]).to(dev)
        with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0:
            print(f"{kind} step {step} loss {loss.item():.3f} lr {lr:.2e} elapsed {el:.0f}s", flush=True)
        step += 1
    print(f"{kind}: {step} steps, {step*batch*seq_len/1e6:.1f} M tokens, final loss {loss.item():.3f}", flush=True)
    return model, step, loss.item()


@torch.no_grad()
def parity_logits(cfg, out_dir, tok, prompts):
    """f32 logits of the exported (bf16-rounded) weights, for deltaserve's parity test."""
    from safetensors.torch import load_file

    model = CausalLm(cfg).float()
    sd = {k: v.float() for k, v in load_file(os.path.join(out_dir, "model.safetensors")).items()}
    model.load_state_dict(sd)
    model.eval()
    out = {}
    for i, p in enumerate(prompts):
        ids = tok.encode(p).ids
        logits = model(torch.tensor([ids]))[0]
        out[f"case{i}.input_ids"] = torch.tensor(ids, dtype=torch.int64)
        out[f"case{i}.all_logits"] = logits.float().contiguous()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--out", default="models")
    ap.add_argument("--minutes", type=float, default=3.5)
    ap.add_argument("--corpus-mb", type=float, default=40)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--models", default="gdn,gdp")
    ap.add_argument("--tiny", action="store_true", help="smoke test: tiny shapes, seconds of training")
    ap.add_argument("--corpus-jsonl", help="use this corpus (one JSON string per line) instead of this Python's stdlib")
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True
    os.makedirs(a.out, exist_ok=True)
    if a.corpus_jsonl:
        import gzip
        opener = gzip.open if a.corpus_jsonl.endswith(".gz") else open
        with opener(a.corpus_jsonl, "rt", encoding="utf-8") as f:
            files = [json.loads(l) for l in f if l.strip()]
        print(f"corpus: {len(files)} files, {sum(map(len, files))/1e6:.1f} MB from {a.corpus_jsonl}", flush=True)
    else:
        files = build_corpus(a.heldout, int(a.corpus_mb * 1e6))
    tok_dir = os.path.join(a.out, "_tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    t0 = time.time()
    tok = train_tokenizer(files, tok_dir)
    print(f"tokenizer: {tok.get_vocab_size()} tokens in {time.time()-t0:.0f}s", flush=True)
    eos = 2
    ids = []
    for enc in tok.encode_batch(files):
        ids.extend(enc.ids)
        ids.append(eos)
    print(f"training tokens: {len(ids)/1e6:.2f} M", flush=True)
    prompts = ["def fibonacci(n):\n", "import os\nimport sys\n\n\nclass ", "    for i in range(len(items)):\n        if "]
    summary = {}
    for kind in a.models.split(","):
        cfg = fla_config(kind)
        if a.tiny:
            cfg.update(hidden_size=64, num_hidden_layers=2, num_heads=2, head_dim=16)
        model, steps, loss = train(kind, ids, cfg, a.minutes, dev, a.seq_len, a.batch)
        out = os.path.join(a.out, f"{kind}-demo")
        export(model, cfg, tok_dir, out)
        logits = parity_logits(cfg, out, tok, prompts)
        save_file(logits, os.path.join(a.out, f"{kind}-demo.parity.safetensors"))
        summary[kind] = {"steps": steps, "final_train_loss": loss, "params": sum(p.numel() for p in model.parameters())}
    json.dump(summary, open(os.path.join(a.out, "train_summary.json"), "w"), indent=2)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Qwen3.5-layout hybrid, ~2B parameters, bf16: deltaserve against HF transformers on the same
GPU, the same weights, in one run.

    python3 benches/hybrid_vs_hf.py --bench-bin target/cuda/release/gpu_bench [--dir /tmp/q35-2b]

1. Builds a random `Qwen3_5ForCausalLM` (transformers' own init) with the issue's shapes: 24
   layers, hidden 2048, three Gated DeltaNet layers to one gated-attention layer, GDN 16 key /
   32 value heads of 128, attention 8 query / 2 KV heads of 256 (partial RoPE 0.25), MLP 6144,
   vocabulary 248,320, tied embeddings; saves it with `save_pretrained`.
2. Times transformers: prefill T=4096 (one forward, `logits_to_keep=1`, SDPA attention and fla's
   kernels for the GDN layers when fla is importable: the library's own fast path) and decode at
   batch 1 and 64 with `generate` (greedy; the per-token time is the difference between 65 and
   1 new tokens, divided by 64), prompts of 256 tokens.
3. Frees the GPU and runs `gpu_bench --hybrid-dir` on the saved checkpoint; prints both side by
   side as a markdown table with the ratios.

`--moe` does the same for Qwen3.5-35B-A3B's per-layer shapes (hidden 2048, GDN 16 key / 32
value heads of 128, attention 16 query / 2 KV heads of 256, 256 experts of 512 with top-8 and a
512-wide shared expert, vocabulary 248,320), cut to 8 layers (6 GDN + 2 attention, 7.9 B
parameters: transformers' model and ours each fit an 80 GB GPU in turn), with decode at batch 1,
16 and 64.

`--attention` instead compares the paged-attention op alone (`gpu_bench --attention-only`) with
PyTorch's `scaled_dot_product_attention` (flash backend, GQA) at the model's attention shape:
prefill T=4096 and decode at batch 1 and 64 over 256 and 4096 cached tokens.
"""

import argparse
import json
import os
import subprocess
import time

import torch

T_PREFILL = 4096
CONTEXT = 256
BATCHES = (1, 64)


def build(path, vocab_size=248320, eos_token_id=248044):
    """The Qwen3.5-2B-layout model (transformers' own init), saved to `path` unless there; a
    smaller vocabulary (and its EOS id) for a served run with the demo tokenizer."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    layer_types = (["linear_attention"] * 3 + ["full_attention"]) * 6
    cfg = Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
        num_attention_heads=8, num_key_value_heads=2, head_dim=256, rms_norm_eps=1e-6,
        max_position_embeddings=262144, linear_conv_kernel_dim=4, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
        layer_types=layer_types, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
        bos_token_id=None, eos_token_id=eos_token_id, pad_token_id=None)
    return init_and_save(Qwen3_5ForCausalLM, cfg, path)


def init_and_save(cls, cfg, path):
    """transformers' own init, on the GPU in bf16 (seconds instead of minutes on the host), saved
    with `save_pretrained` unless `path` already holds a checkpoint."""
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = cls(cfg)
    torch.set_default_dtype(torch.float32)
    if not os.path.exists(os.path.join(path, "config.json")):
        model.save_pretrained(path)
    return model.eval()


def build_moe(path, layers=8):
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    layer_types = (["linear_attention"] * 3 + ["full_attention"]) * (layers // 4)
    cfg = Qwen3_5MoeTextConfig(
        vocab_size=248320, hidden_size=2048, num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=2,
        head_dim=256, rms_norm_eps=1e-6, max_position_embeddings=262144, linear_conv_kernel_dim=4,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
        num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
        layer_types=layer_types, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
        bos_token_id=None, eos_token_id=248044, pad_token_id=None)
    return init_and_save(Qwen3_5MoeForCausalLM, cfg, path)


def median_ms(f, reps, spread=None):
    """The median of `reps` timed calls after two warm-ups; `spread` (a dict) gets their range."""
    times = []
    for i in range(reps + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        f()
        torch.cuda.synchronize()
        if i >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    if spread is not None:
        spread.update(min_ms=times[0], max_ms=times[-1])
    return times[len(times) // 2]


def time_hf(model, batches, prefill_reps):
    out = {}
    vocab = model.config.vocab_size
    ids = (torch.arange(T_PREFILL, device="cuda") * 7919 + 13) % vocab
    with torch.inference_mode():
        spread = {}
        out["prefill_ms"] = median_ms(lambda: model(input_ids=ids[None], use_cache=True, logits_to_keep=1), prefill_reps,
                                      spread)
        out["prefill_min_ms"], out["prefill_max_ms"] = spread["min_ms"], spread["max_ms"]
        for b in batches:
            prompt = (torch.arange(CONTEXT, device="cuda")[None] * 131 + torch.arange(b, device="cuda")[:, None] * 7 + 1) % vocab
            mask = torch.ones_like(prompt)

            def gen(n):
                return lambda: model.generate(input_ids=prompt, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                              do_sample=False, pad_token_id=0)

            t1, t65 = median_ms(gen(1), 3), median_ms(gen(65), 3)
            out[f"decode_{b}_ms"] = (t65 - t1) / 64
    return out


def sdpa_ms(b, ctx, rows, reps=20):
    import torch.nn.functional as F

    q = torch.randn(b, 8, rows, 256, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, 2, ctx, 256, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(reps + 3):
        torch.cuda.synchronize()
        start.record()
        F.scaled_dot_product_attention(q, k, v, is_causal=rows > 1, enable_gqa=True)
        end.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def attention(bench_bin):
    run = subprocess.run([bench_bin, "--attention-only"], capture_output=True, text=True)
    print(run.stderr[-2000:])
    print(f"\n## Paged attention op, 8 query / 2 KV heads of 256, bf16, {torch.cuda.get_device_name()}: deltaserve vs torch "
          f"{torch.__version__} SDPA (GQA), one run\n")
    print("| batch | context | new rows | SDPA ms | deltaserve ms | deltaserve TFLOP/s | cache GB/s | SDPA / deltaserve |")
    print("|---|---|---|---|---|---|---|---|")
    for line in run.stdout.splitlines():
        if line.startswith("OURS "):
            r = json.loads(line[5:])
            ref = sdpa_ms(r["batch"], r["context"], r["rows"])
            print(f"| {r['batch']} | {r['context']} | {r['rows']} | {ref:.3f} | {r['ms']:.3f} | {r['tflops']:.1f} | "
                  f"{r['cache_gb_s']:.0f} | {ref / r['ms']:.2f} |")
    if run.returncode != 0:
        raise SystemExit(f"gpu_bench failed: {run.returncode}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench-bin", required=True)
    ap.add_argument("--dir", default="/tmp/deltaserve-qwen3_5-2b")
    ap.add_argument("--reps", type=int, default=20, help="timed passes: transformers' prefills and gpu_bench's")
    ap.add_argument("--attention", action="store_true", help="only the attention op against SDPA")
    ap.add_argument("--moe", action="store_true", help="Qwen3.5-35B-A3B's layer shapes, 8 layers")
    args = ap.parse_args()
    if args.moe and args.dir == "/tmp/deltaserve-qwen3_5-2b":
        args.dir = "/tmp/deltaserve-qwen3_5_moe"
    batches = (1, 16, 64) if args.moe else BATCHES
    if args.attention:
        return attention(args.bench_bin)
    import transformers

    try:
        import fla  # noqa: F401
        fast = f"fla {fla.__version__} kernels for the GDN layers"
    except ImportError:
        fast = "no fla: transformers' torch GDN path"
    model = build_moe(args.dir) if args.moe else build(args.dir)
    params = sum(p.numel() for p in model.parameters())
    hf = time_hf(model, batches, args.reps)
    print("HF", json.dumps({"transformers": transformers.__version__, "fast_path": fast, "params": params, **hf}), flush=True)
    del model
    torch.cuda.empty_cache()
    ours = {}
    run = subprocess.run([args.bench_bin, "--hybrid-dir", args.dir, "--reps", str(args.reps)], capture_output=True, text=True)
    print(run.stderr[-3000:])
    for line in run.stdout.splitlines():
        print(line)
        if line.startswith("OURS "):
            r = json.loads(line[5:])
            key = r["what"] if r["what"] != "decode" else f"decode_{r['batch']}"
            if r["what"] == "prefill":
                key = f"prefill_{r['algo']}"
            ours[key] = r
    if run.returncode != 0:
        raise SystemExit(f"gpu_bench failed: {run.returncode}")
    what = "Qwen3.5-35B-A3B-layout MoE hybrid (8 layers)" if args.moe else "Qwen3.5-layout hybrid"
    print(f"\n## {what}, {params / 1e9:.2f} B params, bf16, {torch.cuda.get_device_name()}: deltaserve vs transformers "
          f"{transformers.__version__} ({fast}), one run\n")
    print("| | transformers | deltaserve | speed-up | deltaserve % of roofline |")
    print("|---|---|---|---|---|")
    for algo in ("Chunked", "ChunkedBf16"):
        o = ours[f"prefill_{algo}"]["ms"]
        tps = T_PREFILL / o * 1e3
        print(f"| prefill T={T_PREFILL} ({algo}) | {hf['prefill_ms']:.1f} ms ({hf['prefill_min_ms']:.1f}–"
              f"{hf['prefill_max_ms']:.1f}) | {o:.1f} ms ({tps / 1e3:.1f} k tok/s) | "
              f"{hf['prefill_ms'] / o:.2f}× | |")
    for b in batches:
        r = ours[f"decode_{b}"]
        print(f"| decode batch {b}, context {CONTEXT} (ms/step) | {hf[f'decode_{b}_ms']:.2f} | {r['ms']:.2f} | "
              f"{hf[f'decode_{b}_ms'] / r['ms']:.1f}× | {100 * r['roofline_ms'] / r['ms']:.0f}% |")


if __name__ == "__main__":
    main()

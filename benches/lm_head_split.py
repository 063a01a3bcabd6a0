"""The LM head under tensor parallelism, replicated against vocab-parallel, on this host's GPUs.

    python3 benches/lm_head_split.py [GPUS]

deltaserve keeps the LM head whole on every rank: each GPU reads all of it every step and has
every row's logits for the draw. Vocab-parallel would read 1/N of it a GPU and then gather the
logits (fp32, as the sampler reads them) onto every GPU. Both are timed here the way deltaserve
runs its collectives, one process and one NCCL communicator a GPU with every GPU's call queued
together (torch.cuda.nccl), for Qwen's vocabularies at decode batches 1, 16 and 64: GPU ms a
step on GPU 0 (CUDA events around 100 back-to-back steps, after warm-up), the head in bf16.
"""
import sys

import torch
import torch.cuda.nccl as nccl

n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else torch.cuda.device_count()
devs = [torch.device(f"cuda:{r}") for r in range(n)]
print(f"nccl {nccl.version()} on {n} GPUs: {torch.cuda.get_device_name(0)}", flush=True)
print("| vocabulary × hidden | batch | replicated ms | vocab-parallel ms (head / gather) | saved |")
print("|---|---|---|---|---|")
STEPS = 100


def timed(step):
    for _ in range(10):
        step()
    for d in devs:
        torch.cuda.synchronize(d)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(torch.cuda.current_stream(devs[0]))
    for _ in range(STEPS):
        step()
    end.record(torch.cuda.current_stream(devs[0]))
    for d in devs:
        torch.cuda.synchronize(d)
    return start.elapsed_time(end) / STEPS


for vocab, hidden in [(151936, 2048), (248320, 2048), (151936, 4096)]:
    part = vocab // n
    whole = [torch.randn(vocab, hidden, device=d, dtype=torch.bfloat16) * 0.02 for d in devs]
    sliced = [w[:part].contiguous() for w in whole]
    for batch in [1, 16, 64]:
        xs = [torch.randn(batch, hidden, device=d, dtype=torch.bfloat16) for d in devs]
        parts = [torch.empty(batch * part, device=d, dtype=torch.float32) for d in devs]
        gathered = [torch.empty(n * batch * part, device=d, dtype=torch.float32) for d in devs]

        def replicated():
            for r, d in enumerate(devs):
                with torch.cuda.device(d):
                    torch.nn.functional.linear(xs[r], whole[r]).float()

        def head_only():
            for r, d in enumerate(devs):
                with torch.cuda.device(d):
                    parts[r].copy_(torch.nn.functional.linear(xs[r], sliced[r]).float().view(-1))

        def vocab_parallel():
            head_only()
            nccl.all_gather(parts, gathered)

        rep, head, vp = timed(replicated), timed(head_only), timed(vocab_parallel)
        print(f"| {vocab} × {hidden} | {batch} | {rep:.3f} | {vp:.3f} ({head:.3f} / {vp - head:.3f}) | {rep - vp:+.3f} |", flush=True)
    del whole, sliced
    torch.cuda.empty_cache()

"""Where a served step's time goes, from the engine thread's trace
(`DELTASERVE_LOG=deltaserve::scheduler=trace,info deltaserve serve …`, the log's `decode step`
and `prefill step` lines): per decode batch size, the host time to launch the forward, the time
until the step's draws are back on the host (the GPU's forward plus the draw), and the host
time to emit the tokens; and the prefill steps' share of the engine's time.

    python3 benches/step_breakdown.py SERVE_LOG [OUT.md]
"""
import re
import statistics
import sys


def main(path, out=None):
    decode, prefill = [], []
    for line in open(path, errors="replace"):
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        # Numbers only (a listen address such as 0.0.0.0 is not one).
        fields = {k: float(v) for k, v in re.findall(r"(\w+)=(\d+(?:\.\d+)?)(?![\d.])", line)}
        if "decode step" in line:
            decode.append(fields)
        elif "prefill step" in line:
            prefill.append(fields)
    lines = ["| decode batch | steps | launch ms | forward + draw ms | emit ms | step ms |", "|---|---|---|---|---|---|"]
    groups = {}
    for d in decode:
        b = int(d["batch"])
        groups.setdefault("64" if b == 64 else ("2-63" if b > 1 else "1"), []).append(d)
    for name in ["1", "2-63", "64"]:
        g = groups.get(name, [])
        if g:
            med = {k: statistics.median(x[k] for x in g) for k in ["launch_ms", "drawn_ms", "emit_ms", "ms"]}
            lines.append(f"| {name} | {len(g)} | {med['launch_ms']:.2f} | {med['drawn_ms']:.2f} | {med['emit_ms']:.2f} | {med['ms']:.2f} |")
    dec_s = sum(d["ms"] for d in decode) / 1e3
    pre_s = sum(p["ms"] for p in prefill) / 1e3
    lines.append("")
    if prefill:
        med = {k: statistics.median(p.get(k, 0.0) for p in prefill) for k in ["tokens", "ms", "launch_ms", "drawn_ms"]}
        lines.append(
            f"{len(prefill)} prefill steps (median {med['tokens']:.0f} tokens: {med['ms']:.2f} ms, of which launch "
            f"{med['launch_ms']:.2f} ms and waiting for the first tokens {med['drawn_ms']:.2f} ms)."
        )
    lines.append(
        f"Engine time: decode steps {dec_s:.2f} s, prefill steps {pre_s:.2f} s "
        f"({100 * pre_s / max(dec_s + pre_s, 1e-9):.0f}% prefill)."
    )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if out:
        open(out, "w").write(text)


if __name__ == "__main__":
    main(*sys.argv[1:])

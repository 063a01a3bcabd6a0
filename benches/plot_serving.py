#!/usr/bin/env python3
"""Plots a serving sweep: output throughput and latency (TTFT, ITL p50/p99) against
concurrency, from `serve_bench --json` files (`deltaserve-c*.json`) and, when present,
`hf-static.json` (benches/hf_static.py: transformers + fla with static batches). Writes an SVG
drawn by hand (no plotting library needed on the GPU host) and prints a markdown table.

    python3 benches/plot_serving.py RESULTS_DIR OUT.svg
"""
import glob
import json
import math
import os
import sys


def load(d):
    ours = []
    for p in glob.glob(os.path.join(d, "deltaserve-c[0-9]*.json")):
        r = json.load(open(p))
        ours.append((r["max_concurrency"], r))
    ours.sort(key=lambda x: x[0])
    hf = []
    p = os.path.join(d, "hf-static.json")
    if os.path.exists(p):
        hf = sorted(json.load(open(p))["points"], key=lambda x: x["batch"])
    return ours, hf


def panel(x0, y0, w, h, title, xs, series, ylabel, log_y):
    """One chart: series = [(name, colour, [(x, y)])], x on a log2 axis."""
    out = [f'<text x="{x0 + w / 2}" y="{y0 - 10}" text-anchor="middle" font-size="14">{title}</text>']
    out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#888"/>')
    ys = [y for _, _, pts in series for _, y in pts if y and y > 0 and math.isfinite(y)]
    if not ys:
        return out
    lo, hi = (min(ys), max(ys))
    if log_y:
        lo, hi = math.log10(lo) - 0.1, math.log10(hi) + 0.1
    else:
        lo, hi = 0, hi * 1.1
    xl, xh = math.log2(min(xs)), math.log2(max(xs))
    fx = lambda x: x0 + (math.log2(x) - xl) / max(xh - xl, 1e-9) * w
    fy = lambda y: y0 + h - ((math.log10(y) if log_y else y) - lo) / (hi - lo) * h
    for x in xs:
        out.append(f'<text x="{fx(x)}" y="{y0 + h + 16}" text-anchor="middle" font-size="11">{x}</text>')
    for k in range(5):
        v = lo + (hi - lo) * k / 4
        label = f"{10 ** v:.3g}" if log_y else f"{v:.3g}"
        yy = y0 + h - h * k / 4
        out.append(f'<text x="{x0 - 6}" y="{yy + 4}" text-anchor="end" font-size="11">{label}</text>')
        out.append(f'<line x1="{x0}" y1="{yy}" x2="{x0 + w}" y2="{yy}" stroke="#eee"/>')
    out.append(f'<text x="{x0 + w / 2}" y="{y0 + h + 34}" text-anchor="middle" font-size="12">concurrency (requests in flight; static batch for transformers)</text>')
    out.append(f'<text x="{x0 - 48}" y="{y0 + h / 2}" text-anchor="middle" font-size="12" transform="rotate(-90 {x0 - 48} {y0 + h / 2})">{ylabel}</text>')
    for i, (name, colour, pts) in enumerate(series):
        pts = [(x, y) for x, y in pts if y and y > 0 and math.isfinite(y)]
        if pts:
            d = " ".join(f"{'M' if j == 0 else 'L'}{fx(x):.1f},{fy(y):.1f}" for j, (x, y) in enumerate(pts))
            out.append(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="2"/>')
            out += [f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="3" fill="{colour}"/>' for x, y in pts]
        out.append(f'<text x="{x0 + 10}" y="{y0 + 18 + 16 * i}" font-size="12" fill="{colour}">{name}</text>')
    return out


def main(d, svg):
    ours, hf = load(d)
    xs = sorted({c for c, _ in ours} | {p["batch"] for p in hf})
    thr = [("deltaserve, output tokens/s", "#1f77b4", [(c, r["output_throughput"]) for c, r in ours])]
    if hf:
        thr.append(("transformers + fla (static batches)", "#d62728", [(p["batch"], p["output_throughput"]) for p in hf]))
    lat = [
        ("TTFT p50", "#2ca02c", [(c, r["ttft_ms"]["p50"]) for c, r in ours]),
        ("TTFT p99", "#98df8a", [(c, r["ttft_ms"]["p99"]) for c, r in ours]),
        ("ITL p50", "#9467bd", [(c, r["itl_ms"]["p50"]) for c, r in ours]),
        ("ITL p99", "#c5b0d5", [(c, r["itl_ms"]["p99"]) for c, r in ours]),
    ]
    if hf:
        lat.append(("transformers ms a step", "#d62728", [(p["batch"], p["step_ms"]) for p in hf]))
    body = panel(80, 40, 460, 300, "Output throughput", xs, thr, "tokens/s", False)
    body += panel(660, 40, 460, 300, "Latency (deltaserve)", xs, lat, "ms (log)", True)
    with open(svg, "w") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="1180" height="400" font-family="sans-serif">{"".join(body)}</svg>\n')
    print("| concurrency | deltaserve out tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | transformers + fla out tok/s (static batch) | ratio |")
    print("|---|---|---|---|---|---|")
    hf_by = {p["batch"]: p for p in hf}
    for c, r in ours:
        h = hf_by.get(c)
        ratio = f"{r['output_throughput'] / h['output_throughput']:.1f}×" if h else "—"
        hft = f"{h['output_throughput']:.0f}" if h else "—"
        print(f"| {c} | {r['output_throughput']:.0f} | {r['ttft_ms']['p50']:.1f} / {r['ttft_ms']['p99']:.1f} | {r['itl_ms']['p50']:.2f} / {r['itl_ms']['p99']:.2f} | {hft} | {ratio} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

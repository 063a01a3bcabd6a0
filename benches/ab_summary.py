#!/usr/bin/env python3
"""Summarises alternating decode-step runs of gpu_bench (benches/ab_decode.sh) as markdown.

Reads every `{model}-{round}-{variant}.log` in a directory: the decode steps' JSON lines
(`OURS {..."what":"decode"}`, CUDA-graph steps only), or, in a `--model-only` log of a build
that prints none, its table rows (`| B | yes | ms | tokens/s | roofline tokens/s | % |`); and
the T=4096 prefills when the runs timed them (`PREFILL=1`: `OURS {..."what":"prefill"}` lines,
or `--model-only`'s `prefill B=1, T=4096 (...): X ms` lines). For each model it prints one
table: a row per variant, in the order the variants first ran, a column per batch, each cell
the range over the rounds of the step's ms and its share of the roofline (measured in each run,
so the shares compare across rounds), then a column per prefill precision (ms).

    benches/ab_summary.py DIR
"""

import json
import re
import sys
from pathlib import Path

NAME = re.compile(r"^(?P<model>[A-Za-z0-9]+)-(?P<round>\d+)-(?P<variant>.+)\.log$")
TABLE_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*yes\s*\|\s*[\d.]+\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|")
PREFILL_ROW = re.compile(r"^prefill B=1, T=\d+ \((?P<what>[^:]*)\): (?P<ms>[\d.]+) ms")
# Column names of the two prefill precisions, by gpu_bench's algorithm name.
PREFILL_ALGO = {"ChunkedBf16": "prefill bf16", "Chunked": "prefill near-fp32"}


def steps(text):
    """(batch, ms, share of the roofline in %) of each decode step a gpu_bench log reports."""
    from_json, from_table = [], []
    for line in text.splitlines():
        if line.startswith("OURS ") and '"decode"' in line:
            d = json.loads(line[5:])
            if d.get("cuda_graph", True):
                from_json.append((d["batch"], d["ms"], 100.0 * d["roofline_ms"] / d["ms"]))
            continue
        m = TABLE_ROW.match(line)
        if m:
            # The table prints ms rounded to 10 µs; tokens/s carry more digits.
            batch, tps, roof = int(m[1]), int(m[2]), int(m[3])
            from_table.append((batch, 1000.0 * batch / tps, 100.0 * tps / roof))
    return from_json or from_table


def prefills(text):
    """(column, ms) of each T=4096 prefill a gpu_bench log reports (not the batch-invariant ones)."""
    out = []
    for line in text.splitlines():
        if line.startswith("OURS ") and '"prefill"' in line:
            d = json.loads(line[5:])
            if not d.get("batch_invariant") and d.get("algo") in PREFILL_ALGO:
                out.append((PREFILL_ALGO[d["algo"]], d["ms"]))
            continue
        m = PREFILL_ROW.match(line)
        if m:
            out.append(("prefill bf16" if "bf16" in m["what"] else "prefill near-fp32", float(m["ms"])))
    return out


def span(values, fmt):
    lo, hi = min(values), max(values)
    return fmt % lo if fmt % lo == fmt % hi else (fmt % lo) + "–" + (fmt % hi)


def summary(folder):
    """{model: {variant: {batch or prefill column: [(ms, pct or None), ...]}}}, variants and
    models in the order they ran."""
    runs = []
    for p in Path(folder).iterdir():
        m = NAME.match(p.name)
        if m:
            runs.append((int(m["round"]), m["model"], m["variant"], p))
    table = {}
    for _, model, variant, p in sorted(runs, key=lambda r: r[0]):
        cells = table.setdefault(model, {}).setdefault(variant, {})
        text = p.read_text(errors="replace")
        for batch, ms, pct in steps(text):
            cells.setdefault(batch, []).append((ms, pct))
        for column, ms in prefills(text):
            cells.setdefault(column, []).append((ms, None))
    return table


def markdown(table):
    lines = []
    for model, variants in table.items():
        keys = {k for v in variants.values() for k in v}
        batches = sorted(k for k in keys if isinstance(k, int))
        columns = [c for c in PREFILL_ALGO.values() if c in keys]
        lines.append(f"### {model}")
        lines.append("")
        lines.append("| variant | " + " | ".join([f"batch {b}" for b in batches] + columns) + " |")
        lines.append("|---" * (len(batches) + len(columns) + 1) + "|")
        for variant, cells_of in variants.items():
            cells = []
            for key in batches + columns:
                runs = cells_of.get(key, [])
                if not runs:
                    cells.append("")
                    continue
                ms = span([r[0] for r in runs], "%.3f")
                if isinstance(key, int):
                    pct = span([r[1] for r in runs], "%.1f")
                    cells.append(f"{ms} ms ({pct}%, {len(runs)} runs)")
                else:
                    cells.append(f"{ms} ms ({len(runs)} runs)")
            lines.append(f"| {variant} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ab_summary.py DIR")
    table = summary(sys.argv[1])
    if not table:
        sys.exit(f"no {{model}}-{{round}}-{{variant}}.log files with decode steps or prefills in {sys.argv[1]}")
    print(markdown(table))


if __name__ == "__main__":
    main()

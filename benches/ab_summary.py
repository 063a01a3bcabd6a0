#!/usr/bin/env python3
"""Summarises alternating decode-step runs of gpu_bench (benches/ab_decode.sh) as markdown.

Reads every `{model}-{round}-{variant}.log` in a directory: the decode steps' JSON lines
(`OURS {..."what":"decode"}`, CUDA-graph steps only), or, in a `--model-only` log of a build
that prints none, its table rows (`| B | yes | ms | tokens/s | roofline tokens/s | % |`). For
each model it prints one table: a row per variant, in the order
the variants first ran, a column per batch, each cell the range over the rounds of the step's ms
and its share of the roofline (measured in each run, so the shares compare across rounds).

    benches/ab_summary.py DIR
"""

import json
import re
import sys
from pathlib import Path

NAME = re.compile(r"^(?P<model>[A-Za-z0-9]+)-(?P<round>\d+)-(?P<variant>.+)\.log$")
TABLE_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*yes\s*\|\s*[\d.]+\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|")


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


def span(values, fmt):
    lo, hi = min(values), max(values)
    return fmt % lo if fmt % lo == fmt % hi else (fmt % lo) + "–" + (fmt % hi)


def summary(folder):
    """{model: {variant: {batch: [(ms, pct), ...]}}}, variants and models in the order they ran."""
    runs = []
    for p in Path(folder).iterdir():
        m = NAME.match(p.name)
        if m:
            runs.append((int(m["round"]), m["model"], m["variant"], p))
    table = {}
    for _, model, variant, p in sorted(runs, key=lambda r: r[0]):
        per_batch = table.setdefault(model, {}).setdefault(variant, {})
        for batch, ms, pct in steps(p.read_text(errors="replace")):
            per_batch.setdefault(batch, []).append((ms, pct))
    return table


def markdown(table):
    lines = []
    for model, variants in table.items():
        batches = sorted({b for v in variants.values() for b in v})
        lines.append(f"### {model}")
        lines.append("")
        lines.append("| variant | " + " | ".join(f"batch {b}" for b in batches) + " |")
        lines.append("|---" * (len(batches) + 1) + "|")
        for variant, per_batch in variants.items():
            cells = []
            for b in batches:
                runs = per_batch.get(b, [])
                if not runs:
                    cells.append("")
                    continue
                ms = span([r[0] for r in runs], "%.3f")
                pct = span([r[1] for r in runs], "%.1f")
                cells.append(f"{ms} ms ({pct}%, {len(runs)} runs)")
            lines.append(f"| {variant} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ab_summary.py DIR")
    table = summary(sys.argv[1])
    if not table:
        sys.exit(f"no {{model}}-{{round}}-{{variant}}.log files with decode steps in {sys.argv[1]}")
    print(markdown(table))


if __name__ == "__main__":
    main()

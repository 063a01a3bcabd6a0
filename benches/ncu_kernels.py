#!/usr/bin/env python3
"""Sums an Nsight Compute CSV (`ncu --csv --page raw`) by kernel and by kind of work.

Usage: ncu_kernels.py TITLE FILE.csv [STEP_MS]

Reads gpu__time_duration.sum and, when present, dram__bytes_read.sum / dram__bytes_write.sum;
prints one table of kernels (time, share, count, DRAM GB/s) and one of kinds (weights' GEMV and
GEMM, the recurrent step, norms, ...). With STEP_MS (the same step timed without the profiler
in the same run) it also prints the part of the step that no kernel covers: launch gaps.
"""

import csv
import re
import sys
from collections import defaultdict

# Kind of work by kernel name, first match wins.
KINDS = [
    ("weights: GEMV / GEMM", re.compile(r"gemv|nvjet|gemm|xmma|cutlass|skinny", re.I)),
    ("mixer: recurrent step or chunks", re.compile(r"^gdr_|delta|^chunk_", re.I)),
    ("norms", re.compile(r"norm", re.I)),
    ("short conv", re.compile(r"conv", re.I)),
    ("casts and copies", re.compile(r"cast|copy|ucopy", re.I)),
    ("activations", re.compile(r"swiglu|silu|sigmoid|bmul|badd|affine", re.I)),
    ("embedding / index", re.compile(r"index|gather|is_u32|emb", re.I)),
]

# Units as ncu prints them (they vary with its version and --print-units): to ms and to bytes.
SCALE = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3,
         "byte": 1.0, "B": 1.0, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6, "Gbyte": 1e9, "GB": 1e9}


def kind_of(name):
    for kind, rx in KINDS:
        if rx.search(name):
            return kind
    return "other"


def read(path):
    """Rows of (kernel name, ms, DRAM bytes or None)."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    rows = list(csv.reader(lines))
    head, units, data = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(head)}
    t = col["gpu__time_duration.sum"]
    rd, wr = col.get("dram__bytes_read.sum"), col.get("dram__bytes_write.sum")
    out = []
    for r in data:
        ms = float(r[t].replace(",", "")) * SCALE[units[t]]
        nbytes = None
        if rd is not None and wr is not None:
            nbytes = float(r[rd].replace(",", "")) * SCALE[units[rd]] + float(r[wr].replace(",", "")) * SCALE[units[wr]]
        out.append((r[col["Kernel Name"]], ms, nbytes))
    return out


def table(title, groups, total):
    print(f"| {title} | ms | share | launches | DRAM GB/s |")
    print("|---|---|---|---|---|")
    for name, (ms, n, nbytes) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        bw = f"{nbytes / ms / 1e6:.0f}" if nbytes is not None and ms > 0 else "—"
        print(f"| `{name}` | {ms:.3f} | {100 * ms / total:.1f}% | {n} | {bw} |")
    print()


def main():
    title, path = sys.argv[1], sys.argv[2]
    step_ms = float(sys.argv[3]) if len(sys.argv) > 3 else None
    rows = read(path)
    total = sum(ms for _, ms, _ in rows)
    by_name, by_kind = defaultdict(lambda: [0.0, 0, 0.0]), defaultdict(lambda: [0.0, 0, 0.0])
    for name, ms, nbytes in rows:
        for g in (by_name[name], by_kind[kind_of(name)]):
            g[0] += ms
            g[1] += 1
            g[2] = None if nbytes is None or g[2] is None else g[2] + nbytes
    print(f"### {title}: {len(rows)} kernels, {total:.3f} ms of kernel time\n")
    table("kind", by_kind, total)
    table("kernel", by_name, total)
    if step_ms is not None:
        print(f"Step replayed without the profiler: {step_ms:.3f} ms; its {len(rows)} kernels timed one at a time "
              f"under the profiler: {total:.3f} ms.\n")

if __name__ == "__main__":
    main()

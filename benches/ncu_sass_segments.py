#!/usr/bin/env python3
"""Where a kernel's warps spend their time, segment by segment, from Nsight Compute's source page.

    ncu --section WarpStateStats --section SourceCounters -k regex:KERNEL -o REPORT BIN ...
    ncu --import REPORT.ncu-rep --page source --csv --print-source sass > SASS.csv
    benches/ncu_sass_segments.py SASS.csv [--kernel NAME] [--per N]

Cuts the SASS at every barrier, cp.async commit or wait, and exit, and prints for each segment
its share of the warp-state samples, the instructions a warp executed there (divided by --per,
e.g. warps × chunks for the state pass) and its top stall reasons. A segment's samples that are
barrier stalls belong to the barrier that ends the segment before it.
"""
import argparse
import collections
import csv
import re

CUT = re.compile(r"^(BAR|DEPBAR|LDGDEPBAR|EXIT)")


def kernels(path):
    rows = list(csv.reader(open(path)))
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"]
    for n, k in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(rows)
        yield rows[k][1], rows[k + 1], rows[k + 2 : end]


def report(name, hdr, data, per):
    samples = hdr.index("Warp Stall Sampling (All Samples)")
    source = hdr.index("Source")
    executed = hdr.index("Instructions Executed")
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(int(r[samples]) for r in data) or 1
    print(f"## {name}: {total} samples, {sum(int(r[executed]) for r in data) / per:.1f} instructions per unit\n")
    print("| SASS lines | samples | instructions per unit | ends with | top stalls (% of all samples) |")
    print("|---|---|---|---|---|")
    start = 0
    for i, r in enumerate(data):
        words = r[source].split()
        op = words[1] if words and words[0].startswith("@") else (words[0] if words else "")
        if not CUT.match(op) and i + 1 < len(data):
            continue
        seg = data[start : i + 1]
        s = sum(int(x[samples]) for x in seg)
        why = collections.Counter()
        for x in seg:
            for h in stalls:
                why[h[6:]] += int(x[hdr.index(h)])
        top = ", ".join(f"{k} {100 * v / total:.1f}" for k, v in why.most_common(3) if v)
        ex = sum(int(x[executed]) for x in seg) / per
        if s > 0.003 * total:
            print(f"| {start}–{i} | {100 * s / total:.1f}% | {ex:.1f} | `{r[source].strip()[:32]}` | {top} |")
        start = i + 1
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--kernel", default="", help="only kernels whose name contains this")
    ap.add_argument("--per", type=float, default=1.0, help="divide instruction counts by this")
    args = ap.parse_args()
    seen = set()
    for name, hdr, data in kernels(args.csv):
        if args.kernel in name and name not in seen:
            seen.add(name)
            report(name, hdr, data, args.per)


if __name__ == "__main__":
    main()

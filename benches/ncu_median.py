#!/usr/bin/env python3
"""Median time, DRAM bytes and registers of each kernel in an Nsight Compute raw CSV
(`ncu --csv --page raw --metrics gpu__time_duration.sum,dram__bytes_read.sum,
dram__bytes_write.sum,launch__registers_per_thread`), whose lines may follow the profiled
program's own output.

Usage: ncu_median.py CSV [LABEL]
"""
import collections
import csv
import io
import sys


def main():
    path, label = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
    lines = open(path).read().splitlines()
    start = next((n for n, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        print(f"{label}: no profiled kernels in {path}")
        return
    rows = list(csv.DictReader(io.StringIO("\n".join(l for l in lines[start:] if l.startswith('"')))))
    units, runs = rows[0], collections.defaultdict(list)
    num = lambda r, k: float(r[k].replace(",", ""))
    for r in rows[1:]:
        try:
            runs[r["Kernel Name"]].append((num(r, "gpu__time_duration.sum"), num(r, "dram__bytes_read.sum"),
                                           num(r, "dram__bytes_write.sum"), r["launch__registers_per_thread"]))
        except (ValueError, KeyError):
            pass
    for name, v in runs.items():
        times = sorted(x[0] for x in v)
        med = times[len(times) // 2]
        print(f"{label:>12} {name:40} n={len(v)} median {med:g} {units['gpu__time_duration.sum']}"
              f"  read {v[0][1]:g} {units['dram__bytes_read.sum']}  written {v[0][2]:g} {units['dram__bytes_write.sum']}"
              f"  regs {v[0][3]}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Builds pruning/data/calibration.txt, the text `deltaserve prune` calibrates on when no
`--calibration` is given: modules of CPython's standard library (PSF License 2.0), chosen for
their mix of English docstrings and code, leaving out every file that shares an 8-line window
with the held-out evaluation text (so pruned models are not scored on their calibration data).

    python3 tools/calibration_text.py --heldout ../shared/fixtures/corpus/heldout.txt
"""

import argparse
import os
import sys
import sysconfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from demo_corpus import shingles  # noqa: E402

MODULES = [
    "textwrap.py", "argparse.py", "functools.py", "dataclasses.py", "enum.py", "heapq.py",
    "bisect.py", "statistics.py", "fractions.py", "string.py", "difflib.py", "shlex.py",
    "csv.py", "calendar.py", "fnmatch.py", "glob.py", "graphlib.py", "ipaddress.py",
    "pprint.py", "queue.py", "sched.py", "secrets.py", "selectors.py", "shutil.py",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--out", default="pruning/data/calibration.txt")
    ap.add_argument("--kb", type=int, default=320)
    a = ap.parse_args()
    held = shingles(open(a.heldout, encoding="utf-8").read())
    root = sysconfig.get_paths()["stdlib"]
    parts, size = [], 0
    for name in MODULES:
        text = open(os.path.join(root, name), encoding="utf-8").read()
        if shingles(text) & held:
            print(f"skip {name}: shares text with the held-out file")
            continue
        parts.append(text)
        size += len(text.encode())
        print(f"take {name}: {len(text.encode()) / 1e3:.0f} kB")
        if size >= a.kb * 1000:
            break
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n\n".join(parts))
    print(f"{a.out}: {size / 1e3:.0f} kB from {len(parts)} modules of Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The demo models' training corpus: Python standard-library sources, minus every file that
shares text with the held-out evaluation file. Needs no PyTorch, so the corpus can be built on
a machine without it:  python3 tools/demo_corpus.py --heldout heldout.txt --out corpus.jsonl.gz
"""

import argparse
import gzip
import hashlib
import json
import os
import sysconfig


def shingles(text, width=8):
    """Hashes of every window of `width` consecutive non-blank lines with some substance."""
    lines = [l.rstrip() for l in text.splitlines() if l.strip()]
    out = set()
    for i in range(0, max(0, len(lines) - width + 1)):
        w = "\n".join(lines[i:i + width])
        if len(w) >= 160:
            out.add(hashlib.blake2b(w.encode(), digest_size=8).digest())
    return out


def build_corpus(heldout_path, limit_bytes):
    held = shingles(open(heldout_path, encoding="utf-8").read())
    root = sysconfig.get_paths()["stdlib"]
    files, kept, dropped = [], 0, 0
    for dirpath, dirnames, names in sorted(os.walk(root)):
        dirnames.sort()
        if "site-packages" in dirpath or "dist-packages" in dirpath:
            continue
        for n in sorted(names):
            if not n.endswith(".py"):
                continue
            try:
                text = open(os.path.join(dirpath, n), encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            # Any shared 8-line window with the held-out text excludes the whole file.
            if shingles(text) & held:
                dropped += 1
                continue
            files.append(text)
            kept += len(text)
            if kept >= limit_bytes:
                break
    print(f"corpus: {len(files)} files, {kept/1e6:.1f} MB kept, {dropped} files left out (in held-out text)", flush=True)
    return files



def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus-mb", type=float, default=64)
    a = ap.parse_args()
    files = build_corpus(a.heldout, int(a.corpus_mb * 1e6))
    with gzip.open(a.out, "wt", encoding="utf-8") as f:
        for t in files:
            f.write(json.dumps(t) + "\n")


if __name__ == "__main__":
    main()

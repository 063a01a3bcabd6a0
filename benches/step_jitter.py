"""Where a served stream's slow inter-token gaps come from, from the engine thread's trace
(`DELTASERVE_LOG=deltaserve::scheduler=trace,info deltaserve serve …`): the percentiles of the
decode steps' own durations and of the gaps between the ends of consecutive steps (a step's
duration plus the engine loop's time between steps), to set beside the client's ITL
percentiles. When the engine's p99 is near its p50 and the client's is not, the slow gaps are in
the delivery (HTTP, the client), not the engine.

    python3 benches/step_jitter.py SERVE_LOG
"""
import datetime
import re
import sys


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def main(path):
    steps, ends = [], []
    for line in open(path, errors="replace"):
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        if "decode step" not in line and "prefill step" not in line:
            continue
        stamp = re.match(r"(\d{4}-\d\d-\d\dT[\d:.]+)Z", line)
        ms = re.search(r"\bms=([\d.]+)", line)
        if not (stamp and ms):
            continue
        t = datetime.datetime.fromisoformat(stamp.group(1)[:26])
        ends.append(t.timestamp() * 1e3)
        if "decode step" in line:
            steps.append(float(ms.group(1)))
    gaps = [b - a for a, b in zip(ends, ends[1:]) if b - a < 1000]
    print("| engine | n | p50 ms | p90 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|")
    for name, xs in [("decode step duration", steps), ("gap between step ends", gaps)]:
        print(f"| {name} | {len(xs)} | {pct(xs, 50):.2f} | {pct(xs, 90):.2f} | {pct(xs, 99):.2f} | {max(xs) if xs else float('nan'):.2f} |")


if __name__ == "__main__":
    main(sys.argv[1])

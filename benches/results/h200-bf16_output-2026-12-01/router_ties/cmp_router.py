import sys, collections
def load(p):
    d = {}
    for line in open(p):
        f = line.split()
        call, row = int(f[0]), int(f[1])
        top = [(int(x.split(':')[0]), float(x.split(':')[1])) for x in f[2:]]
        d[(call, row)] = top
    c0 = min(c for c, _ in d)
    return {(c - c0, r): t for (c, r), t in d.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
k = len(next(iter(a.values()))) - 1
diffs = 0
for key in sorted(a):
    ta, tb = a[key], b[key]
    sa, sb = set(i for i, _ in ta[:k]), set(i for i, _ in tb[:k])
    if sa != sb:
        diffs += 1
        if diffs <= 5:
            print(f"layer-call {key[0]} token {key[1]}: {sorted(sa ^ sb)} swapped; k-th/(k+1)-th logits A {ta[k-1][1]:.6g}/{ta[k][1]:.6g} (gap {ta[k-1][1]-ta[k][1]:.3g}), B {tb[k-1][1]:.6g}/{tb[k][1]:.6g} (gap {tb[k-1][1]-tb[k][1]:.3g})")
gaps = sorted(t[k-1][1] - t[k][1] for t in a.values())
print(f"{diffs} of {len(a)} (layer, token) top-{k} sets differ; A's k/(k+1) gaps: zero {sum(g == 0 for g in gaps)}, median {gaps[len(gaps)//2]:.3g}")

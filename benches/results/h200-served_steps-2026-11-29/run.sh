#!/bin/bash
# Call 9: where a served batch-64 decode step's time goes on this build: the bare step (graphs)
# beside the server at 64 streams (512-token prompts, 256-token outputs), plain and traced
# (DELTASERVE_LOG=deltaserve::scheduler=trace): the period of consecutive decode steps launched
# ahead at batch 64 against the bare step.
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run9.sh $L/run.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $L/gpu.txt
printf '#!/bin/sh\nDELTASERVE_LOG=deltaserve::scheduler=trace,info exec /tmp/b/deltaserve "$@"\n' > /tmp/b/traced
chmod +x /tmp/b/traced
M=/tmp/deltaserve-gdn-1.3b-v4096
python3 -c "import json; c=json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size']=4096; json.dump(c, open('$L/config.json','w'))"
/tmp/b/deltaserve init-random --config $L/config.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1
timeout 60 /tmp/b/gpu_bench --model-only --no-prefill --graphs-only --model-dir $M --batches 32,64 > $L/bare.log 2>&1
echo "bare: $(grep -E '^\| [0-9]+ \| yes' $L/bare.log | awk -F'|' '{printf "%s:%s ", $2, $4}')"
MODEL=$M C=64 ROUNDS=1 timeout 150 bash benches/ab_serving.sh /tmp/b/deltaserve /tmp/b/traced /tmp/b/serve_bench $L/ab > $L/ab.log 2>&1
echo "ab rc=$?"; cat $L/ab/ab.md
f=$L/ab/serve-after-1.log
sed 's/\x1b\[[0-9;]*m//g' $f | grep -E "decode step|prefill step" > $L/steps.log
python3 - $L/steps.log <<'PY'
import re,sys,statistics
from datetime import datetime
rows=[]
for l in open(sys.argv[1]):
    t=datetime.strptime(l[:26],"%Y-%m-%dT%H:%M:%S.%f")
    ahead="ahead=true" in l; m=re.search(r"batch=(\d+)",l)
    kind="decode" if "decode step" in l else "prefill"
    rows.append((t,kind,int(m.group(1)) if m else 0,ahead,l))
per=[];per_any=[]
for a,b in zip(rows,rows[1:]):
    dt=(b[0]-a[0]).total_seconds()*1e3
    if a[1]==b[1]=="decode" and a[2]==b[2]==64:
        per_any.append(dt)
        if a[3] and b[3]: per.append(dt)
def q(v,p): v=sorted(v); return v[int(p*(len(v)-1))] if v else float('nan')
print(f"batch-64 decode steps ahead, consecutive: {len(per)}; period p10/p50/p90 {q(per,.1):.3f}/{q(per,.5):.3f}/{q(per,.9):.3f} ms")
print(f"batch-64 decode steps, any consecutive: {len(per_any)}; period p50 {q(per_any,.5):.3f} ms")
ds=[r for r in rows if r[1]=="decode"]; ps=[r for r in rows if r[1]=="prefill"]
print(f"decode lines {len(ds)} (ahead {sum(r[3] for r in ds)}), prefill/mixed lines {len(ps)}")
for k in ["drawn_ms","emit_ms","launch_ms"]:
    v=[float(re.search(k+r"=([\d.]+)",r[4]).group(1)) for r in ds if r[2]==64 and re.search(k+r"=([\d.]+)",r[4])]
    if v: print(f"  batch 64 {k}: p50 {q(v,.5):.3f} p90 {q(v,.9):.3f} (n={len(v)})")
PY
xz -9 $L/steps.log; rm -f $L/ab/serve-*.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs

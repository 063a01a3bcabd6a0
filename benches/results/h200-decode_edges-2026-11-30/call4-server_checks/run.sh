#!/bin/bash
# Call 7: the server's lent logits under structured outputs and more families: the GPU
# structured-output check (demo model) and the GPU-against-CPU serving check on gdp, olmo_hybrid,
# qwen3_5_moe and delta_net, on the build of dc61dfc.
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run7.sh $L/run.sh
LOGS=$L/structured timeout 240 bash scripts/gpu-structured-check.sh /tmp/n/deltaserve models/gdn-demo > $L/structured.log 2>&1
echo "structured rc=$? $(tail -2 $L/structured.log | tr '\n' ' ')"
for m in gdp olmo_hybrid qwen3_5_moe delta_net; do LOGS=$L/serve-check-$m timeout 120 bash scripts/gpu-serve-check.sh /tmp/n/deltaserve tests/fixtures/compact/$m > $L/serve-check-$m.log 2>&1; echo "serve-check $m rc=$? $(tail -1 $L/serve-check-$m.log)"; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

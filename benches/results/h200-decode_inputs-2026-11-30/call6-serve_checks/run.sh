#!/bin/bash
# Call 6: the GPU server's text against the CPU server's with the final build (gdn, qwen3_5).
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/t.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run6.sh $L/run.sh
for m in gdn qwen3_5; do LOGS=$L/serve-check-$m timeout 100 bash scripts/gpu-serve-check.sh /tmp/n/deltaserve tests/fixtures/compact/$m > $L/serve-check-$m.log 2>&1; echo "serve-check $m rc=$? $(tail -1 $L/serve-check-$m.log)"; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

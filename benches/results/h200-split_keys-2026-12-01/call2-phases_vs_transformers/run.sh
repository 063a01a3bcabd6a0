#!/usr/bin/env bash
# The split-key pass: its phases (-DWG_PROFILE probe), the prefill mixer against fla 0.6.0 with the
# pass and without (DELTASERVE_TC_WG=0: mma.sync), alternating, two rounds, and the 1.39B's T=4096
# prefill against transformers 5.17 + fla 0.6.0 in the same call.
L=$OUT/logs; mkdir -p $L/mixer /tmp/n
tar -C /tmp/n -xJf .devbuild/b93.tar.xz
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $L/gpu.txt 2>&1
SECONDS=0
nvcc .devbuild/wgp_prof.o -o /tmp/wgp_prof > $L/probe_link.log 2>&1
for s in "1.39B 1x4096" "1.39B 8x2048" "Qwen3.5 GDN 1x4096"; do PROBE_ONLY="$s" timeout 60 /tmp/wgp_prof > "$L/probe_prof_${s// /_}.md" 2>&1; done
grep -h -a 'phases\|CTAs:' $L/probe_prof_*.md; echo "probe at ${SECONDS}s"
FLA=$(mktemp -d); pip install --quiet --no-deps --no-index --target "$FLA" .whl/*.whl 2>/dev/null
PYTHONPATH=$FLA timeout 150 python3 benches/fla_mixer.py $L/mixer/fla_mixer.json 2>$L/mixer/fla_mixer.log; echo "fla rc $? at ${SECONDS}s"
for r in 1 2; do
  timeout 60 /tmp/n/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/split_$r.md 2>&1; echo "split $r rc $?"
  DELTASERVE_TC_WG=0 timeout 60 /tmp/n/gpu_bench --prefill-mixer-only --fla-json $L/mixer/fla_mixer.json > $L/mixer/mma_$r.md 2>&1; echo "mma $r rc $?"
done
for f in $L/mixer/split_1.md $L/mixer/mma_1.md $L/mixer/split_2.md $L/mixer/mma_2.md; do echo $f; grep '^| [0-9]' $f; done
echo "at ${SECONDS}s"
timeout 120 /tmp/n/gpu_bench --model-only --batches 1 --graphs-only > $L/model-0.md 2>&1; echo "model 0 rc $? at ${SECONDS}s"; grep -i "^prefill" $L/model-0.md
PYTHONPATH=$FLA timeout 200 python3 benches/fla_prefill.py /tmp/deltaserve-gdn-1.3b $L/fla_prefill.json 4096 20 > $L/fla_prefill.log 2>&1; echo "fla_prefill rc $? at ${SECONDS}s"; tail -2 $L/fla_prefill.log
for r in 1 2; do
  timeout 60 /tmp/n/gpu_bench --model-only --batches 1 --graphs-only > $L/model-$r.md 2>&1; grep -i "^prefill" $L/model-$r.md
  DELTASERVE_TC_WG=0 timeout 60 /tmp/n/gpu_bench --model-only --batches 1 --graphs-only > $L/model-mma-$r.md 2>&1; grep -i "^prefill" $L/model-mma-$r.md
done
echo "end at ${SECONDS}s"
cd $OUT && tar czf logs.tgz logs && rm -rf logs

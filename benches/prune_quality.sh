#!/usr/bin/env bash
# Held-out perplexity of every pruning method at ratios 0.5 and 0.75 on the demo models.
# Usage: benches/prune_quality.sh [HELDOUT] [CALIBRATION]   (defaults: ../shared/fixtures/corpus/*)
set -euo pipefail
cd "$(dirname "$0")/.."
heldout=${1:-../shared/fixtures/corpus/heldout.txt}
calib=${2:-../shared/fixtures/corpus/calibration.txt}
bin=target/release/deltaserve
cargo build --release -q -p deltaserve
tmp=$(mktemp -d)
ppl() { "$bin" eval ppl --model "$1" --text "$heldout" --seq-len 512 2>/dev/null | sed 's/.*"ppl":\([0-9.]*\).*/\1/'; }
printf "| model | ratio | baseline | rand | l1 | swanda | grad | drrqr |\n|---|---|---|---|---|---|---|---|\n"
for model in ${MODELS:-gdn-demo gdp-demo}; do
  base=$(ppl "models/$model")
  for ratio in 0.5 0.75; do
    row="| $model | $ratio | $(printf %.2f "$base")"
    for m in rand l1 swanda grad drrqr; do
      "$bin" prune --quiet --method "$m" --ratio "$ratio" "models/$model" -o "$tmp/$model-$m-$ratio" --calibration "$calib" --seq-len 2048 >/dev/null 2>&1
      row="$row | $(printf %.2f "$(ppl "$tmp/$model-$m-$ratio")")"
    done
    echo "$row |"
  done
done
rm -rf "$tmp"

#!/usr/bin/env bash
# The chat workload's time to first token with the prefix cache and without, for one or more
# server builds in one GPU call: every build, with the cache then with `--no-prefix-cache`,
# round after round, so that builds and modes compare within one run of the GPU. Each server is
# warmed with two 3,000-token requests (with WARM=1 also with the chat workload's other
# conversations: no question in common, the same system prompt and pass shapes), then runs
# `loadgen --workload chat` (a ~2,000-token system prompt, TURNS turns, 64-token answers,
# greedy) for each number of conversations.
#
#   [ROUNDS=2] [CONVS="1 8"] [TURNS=5] [WARM=1] [MODEL=DIR] [TOKENIZER_FROM=DIR] [VOCAB=N] \
#     [SYSTEM_TOKENS=2000] [THINK_MS=0] [MODES="cache nocache"] [FLAGS_<mode>="server flags"] \
#     benches/prefix_cache_chat.sh LOADGEN_BIN OUT_DIR LABEL=DELTASERVE_BIN...
# A random model's answers come back as other token ids when the client re-sends their text
# (BPE encodes the decoded text otherwise; with the config's 32,000-token vocabulary and the demo
# tokenizer's 4,096, most ids have no text at all), so each next turn finds only the prompt before
# the answer cached. TOKENIZER_FROM=DIR of benches/char_tokenizer.py, with VOCAB=4096 and
# SYSTEM_TOKENS=630 (a system prompt of ~2,030 one-character tokens), gives answers that come back as the same ids,
# as a trained model's do. THINK_MS: loadgen's mean pause before each next turn (0: an agent's
# immediate follow-up, which re-prefills the answer in its own pass; a person's pause lets the
# server re-prefill it before the turn arrives).
# A mode's flags default to `--prefix-cache-memory 0.3` (cache) and `--no-prefix-cache` (nocache);
# other modes name theirs, e.g. MODES="small host" FLAGS_small="--prefix-cache-memory 1GB"
# FLAGS_host="--prefix-cache-memory 1GB --prefix-cache-host-memory 24GiB". After each mode the
# server's prefix-cache counters are appended to chat.md.
# MODEL defaults to a random 1.39B Gated DeltaNet (benches/configs/gdn-1.3b.json, bf16), written
# on first use. Rows of OUT_DIR/chat.md: conversations, turns, requests, TTFT p50 / p99 ms, ITL
# p50 ms, tokens/s, errors.
set -euo pipefail
LOADGEN=$1 OUT=$2
shift 2
MODEL=${MODEL:-/tmp/deltaserve-gdn-1.3b}
mkdir -p "$OUT"
source "$(dirname "$0")/../scripts/serve-common.sh"
first_bin=${1#*=}
if [ ! -f "$MODEL/config.json" ]; then
  config="$(dirname "$0")/configs/gdn-1.3b.json"
  if [ -n "${VOCAB:-}" ]; then
    python3 -c "import json; c = json.load(open('$config')); c['vocab_size'] = $VOCAB; json.dump(c, open('$OUT/config.json', 'w'))"
    config=$OUT/config.json
  fi
  "$first_bin" init-random --config "$config" -o "$MODEL" --dtype bf16 \
    --tokenizer-from "${TOKENIZER_FROM:-models/gdn-demo}" >"$OUT/init.log" 2>&1
fi
# The chat workload against the server on port $1 for each number of conversations, with
# loadgen's further flags; its rows to stdout.
chat() {
  local port=$1
  shift
  for c in ${CONVS:-1 8}; do
    timeout 180 "$LOADGEN" --url http://127.0.0.1:$port --workload chat --clients "$c" --turns "${TURNS:-5}" \
      --system-tokens "${SYSTEM_TOKENS:-2000}" --think-ms "${THINK_MS:-0}" --max-tokens 64 --temperature 0 "$@"
  done
}
port=18800
for round in $(seq 1 "${ROUNDS:-2}"); do
  for build in "$@"; do
    label=${build%%=*} bin=${build#*=}
    for mode in ${MODES:-cache nocache}; do
      port=$((port + 1))
      FLAGS_cache=${FLAGS_cache:---prefix-cache-memory 0.3} FLAGS_nocache=${FLAGS_nocache:---no-prefix-cache}
      flags_var="FLAGS_$mode"
      read -r -a extra <<<"${!flags_var:-}"
      start_server "$bin" $port "$OUT/serve-$label-$mode-$round.log" --model "$MODEL" --device cuda --dtype bf16 \
        --max-num-seqs 32 --max-num-batched-tokens 2048 "${extra[@]}"
      "$LOADGEN" --url http://127.0.0.1:$port --clients 2 --requests 2 --prompt-tokens 3000 --max-tokens 4 --distinct >/dev/null
      if [ "${WARM:-0}" = 1 ]; then
        # The same workload with other conversations first: the server's lazily captured graphs
        # (mixed passes) are then those of a server that has run a while.
        chat $port --first-conversation 1000 >/dev/null
      fi
      echo "## $label, $mode, round $round${WARM:+, warm $WARM}" >>"$OUT/chat.md"
      chat $port >>"$OUT/chat.md"
      python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode())" |
        grep -E '^deltaserve:prefix_cache_(hits|queries|spills|evictions)_total|^deltaserve:prefix_cache_(host_)?entries' >>"$OUT/chat.md" || true
      kill "$server_pid" 2>/dev/null || true
      wait "$server_pid" 2>/dev/null || true
    done
  done
done
cat "$OUT/chat.md"

# Sourced by the GPU check scripts: `serve DEVICE PORT [EXTRA FLAGS...]` starts `$BIN serve` on
# `$MODEL` (f32) with its log in `$LOGS/serve-DEVICE.log`, remembers its pid in `pids` (killed
# on exit), and waits until /ready answers (60 s), printing the log if it never does.
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT

serve() {
  local device=$1 port=$2
  shift 2
  "$BIN" serve --model "$MODEL" --device "$device" --dtype f32 --port "$port" "$@" >"$LOGS/serve-$device.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 120); do
    if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/ready')" 2>/dev/null; then return 0; fi
    sleep 0.5
  done
  echo "server on $device did not become ready; log:" >&2
  cat "$LOGS/serve-$device.log" >&2
  return 1
}

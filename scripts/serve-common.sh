# Sourced by the GPU check scripts and the serving benchmarks. `start_server BIN PORT LOG
# [FLAGS...]` starts `BIN serve --port PORT FLAGS...` with its log in LOG, leaves its pid in
# `server_pid` and in `pids` (killed on exit), and waits until /ready answers ($READY_SECS, 120 s), printing
# the log if it never does. `serve DEVICE PORT [EXTRA FLAGS...]` starts `$BIN` on `$MODEL` (f32)
# that way, logging to `$LOGS/serve-DEVICE.log`.
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT

start_server() {
  local bin=$1 port=$2 log=$3
  shift 3
  "$bin" serve --port "$port" "$@" >"$log" 2>&1 &
  server_pid=$!
  pids+=("$server_pid")
  for _ in $(seq 1 $((${READY_SECS:-120} * 2))); do
    if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/ready')" 2>/dev/null; then return 0; fi
    sleep 0.5
  done
  echo "server on port $port did not become ready; log:" >&2
  cat "$log" >&2
  return 1
}

serve() {
  local device=$1 port=$2
  shift 2
  start_server "$BIN" "$port" "$LOGS/serve-$device.log" --model "$MODEL" --device "$device" --dtype f32 "$@"
}

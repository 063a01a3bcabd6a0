#!/usr/bin/env bash
# Tensor parallel runs on a machine with several GPUs, in one call:
#
#   benches/tensor_parallel.sh BIN_DIR OUT_DIR [STAGE...]
#
# BIN_DIR holds `deltaserve`, `gpu` (the GPU test binary), `tp_bench` and `serve_bench`, built
# with `--features nccl`. Stages (all by default, in this order):
# - smoke: the engine at TP=2 on the compact gdn fixture (f32), decode steps as CUDA graphs and
#   eager; if only eager works, the stages after run eagerly (or as GRAPH_FLAG says);
# - tests: the GPU test suite, `gpu_tensor_parallel_equals_one_gpu` included (TP 2 and 4 against
#   one GPU on the fixtures);
# - gdn: `tp_bench` on the random bf16 1.39B Gated DeltaNet (benches/configs/gdn-1.3b.json; its
#   6 heads split 2 ways, not 4) at TP 1, 2, and 2 without CUDA graphs;
# - serve: that model served at TP 1 and 2, `serve_bench` at concurrency 64 (512-token prompts,
#   256-token outputs);
# - q3n64: `tp_bench` at TP 1, 2 and 4 on Qwen3-Next-80B's shapes with 64 experts a layer instead
#   of 512 (23 GB: fits one GPU), experts cut per rank and (at 2 and 4) whole experts a rank
#   (`--expert-parallel on`); Q3N_RUNS picks the runs ("1 2 2ep 4 4ep");
# - q3n12l: the same on 12 of the 80B's layers with all 512 experts (40 GB);
# - q3n80b: Qwen3-Next-80B-A3B's shapes (159 GB bf16: does not fit one GPU) written to /dev/shm
#   (the shards it cannot hold to SPILL_DIR on disk), served over every GPU (or TP=$BIG_TP),
#   `serve_bench` at concurrency 16.
# Results: OUT_DIR/tp_bench.jsonl (`TP` lines), smoke.md, served.md, q3n80b.md, logs.
# `benches/nccl_check.py` checks NCCL itself on the host (PyTorch's grouped all-reduce).
set -uo pipefail
BIN=$1 OUT=$2
shift 2
STAGES=${*:-smoke tests gdn serve q3n64 q3n12l q3n80b}
mkdir -p "$OUT"
# NVLink multicast stays off (KINDS.md: it can take the host's shared GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The GPU test binary cannot set this itself before its first CUDA call (deltaserve and tp_bench
# do, for TP > 1): see `load_kernels_eagerly_for`.
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-EAGER}
GRAPH_FLAG=${GRAPH_FLAG:-}
if ! ldconfig -p | grep -q libnccl.so.2; then
  NCCL_LIB=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0] + '/lib')")
  export LD_LIBRARY_PATH=$NCCL_LIB:${LD_LIBRARY_PATH:-}
fi
GPUS=$(nvidia-smi -L | wc -l)
nvidia-smi -L >"$OUT/gpus.txt"
python3 -c "import torch; print('nccl', torch.cuda.nccl.version())" >>"$OUT/gpus.txt" 2>&1
source "$(dirname "$0")/../scripts/serve-common.sh"
log() { echo "== $(date +%T) $*" | tee -a "$OUT/stages.log"; }

random_q3n() { # CONFIG DIR [ARGS]: a random Qwen3-Next checkpoint, written by one process a GPU
  local cfg=$1 dir=$2
  shift 2
  [ -f "$dir/model.safetensors.index.json" ] && return 0
  for k in $(seq 0 $((GPUS - 1))); do
    python3 benches/random_qwen3_next.py "$cfg" "$dir" --part "$k" --parts "$GPUS" "$@" &
  done
  wait
  python3 benches/random_qwen3_next.py "$cfg" "$dir" --index
  cp tests/fixtures/compact/qwen3_next/tokenizer*.json "$dir/"
}

for stage in $STAGES; do
  log "stage $stage"
  case $stage in
  smoke)
    # TP=2 on the compact gdn fixture (f32), decode steps as CUDA graphs and eager. A run still
    # going after SMOKE_SECS is stopped; its threads' stacks (gdb, if there) and its log (each
    # step, DELTASERVE_LOG=debug) show where it stood.
    : >"$OUT/smoke.md"
    WORKS=""
    for v in graphs eager; do
      flag=""
      [ $v = eager ] && flag=--no-cuda-graphs
      DELTASERVE_LOG=debug "$BIN/tp_bench" --model tests/fixtures/compact/gdn --tensor-parallel-size 2 \
        --dtype f32 --prefill 100 --batches 1,3 --reps 2 --steps 3 $flag >"$OUT/smoke-$v.log" 2>&1 &
      pid=$!
      for _ in $(seq 1 "${SMOKE_SECS:-45}"); do kill -0 $pid 2>/dev/null || break; sleep 1; done
      if kill -0 $pid 2>/dev/null; then
        command -v gdb >/dev/null && timeout -s KILL 30 gdb -p $pid -batch -ex "thread apply all bt 25" >"$OUT/hang-$v.txt" 2>&1
        kill -9 $pid
        echo "smoke $v: hung" | tee -a "$OUT/smoke.md"
        continue
      fi
      if wait $pid; then
        echo "smoke $v: passed" | tee -a "$OUT/smoke.md"
        WORKS="$WORKS $v"
      else
        echo "smoke $v: failed" | tee -a "$OUT/smoke.md"
      fi
      grep "^TP " "$OUT/smoke-$v.log" | tee -a "$OUT/smoke.md"
    done
    # Without working graphs the stages after decode eagerly.
    case "$WORKS" in
    *graphs*) ;;
    *eager*) export GRAPH_FLAG=--no-cuda-graphs ;;
    *) log "smoke: TP=2 did not work"; exit 3 ;;
    esac
    log "smoke: stages after run with ${GRAPH_FLAG:-CUDA graphs}"
    ;;
  tests)
    DELTASERVE_TESTS_DIR=$PWD/tests timeout -s KILL "${TESTS_SECS:-240}" "$BIN/gpu" ${TESTS_FILTER:-} >"$OUT/gpu_tests.log" 2>&1
    grep -E "GPU tests:|TP=|FAILED|panicked" "$OUT/gpu_tests.log" | tail -40
    ;;
  gdn)
    GDN=/tmp/deltaserve-gdn-1.3b-v4096
    python3 -c "import json; c = json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size'] = 4096; json.dump(c, open('$OUT/gdn-config.json', 'w'))"
    [ -f "$GDN/config.json" ] || "$BIN/deltaserve" init-random --config "$OUT/gdn-config.json" -o "$GDN" --dtype bf16 --tokenizer-from models/gdn-demo >"$OUT/init.log" 2>&1
    # Unsplit, split, and split without CUDA graphs.
    for run in "1" "2" "2 --no-cuda-graphs"; do
      set -- $run
      timeout -s KILL 120 "$BIN/tp_bench" --model "$GDN" --tensor-parallel-size $1 --reps 5 ${2:-} 2>>"$OUT/tp_bench.err" \
        | sed "s/^TP /TP gdn-1.3b /" | tee -a "$OUT/tp_bench.jsonl"
    done
    ;;
  serve)
    GDN=/tmp/deltaserve-gdn-1.3b-v4096
    port=18900
    for tp in ${SERVE_TPS:-1 2}; do
      port=$((port + 1))
      start_server "$BIN/deltaserve" $port "$OUT/serve-tp$tp.log" --model "$GDN" --device cuda --dtype bf16 --max-num-seqs 64 \
        --max-model-len 4096 --max-queue 4096 --tensor-parallel-size $tp $GRAPH_FLAG || continue
      "$BIN/serve_bench" --url http://127.0.0.1:$port --num-prompts 16 --input-len 512 --output-len 32 --max-concurrency 16 --label warmup >/dev/null
      timeout 90 "$BIN/serve_bench" --url http://127.0.0.1:$port --num-prompts 256 --input-len 512 --output-len 256 --max-concurrency 64 \
        --label "tp$tp" --json "$OUT/served-tp$tp.json" | tail -1 | tee -a "$OUT/served.md"
      kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null
    done
    ;;
  q3n64 | q3n12l)
    # q3n64: all 48 layers with 64 experts each; q3n12l: 12 layers with all 512 experts (the
    # 80B's per-layer shapes, 40 GB: fits one GPU).
    if [ $stage = q3n64 ]; then edit="c['num_experts'] = 64"; else edit="c['num_hidden_layers'] = 12"; fi
    python3 -c "import json; c = json.load(open('benches/configs/qwen3-next-80b-a3b.json')); $edit; json.dump(c, open('$OUT/$stage-config.json', 'w'))"
    Q=/tmp/deltaserve-$stage
    random_q3n "$OUT/$stage-config.json" $Q >"$OUT/$stage-write.log" 2>&1
    du -sh $Q >>"$OUT/$stage-write.log"
    # Experts cut per rank, then (`ep`) whole experts a rank.
    for run in ${Q3N_RUNS:-1 2 2ep 4 4ep}; do
      tp=${run%ep}
      [ $tp -le "$GPUS" ] || continue
      ep="--expert-parallel off"
      [ "$run" != "$tp" ] && ep="--expert-parallel on"
      timeout -s KILL 150 "$BIN/tp_bench" --model $Q --tensor-parallel-size $tp --reps 3 --prefill 4096 $ep $GRAPH_FLAG 2>>"$OUT/tp_bench.err" | sed "s/^TP /TP $stage /" | tee -a "$OUT/tp_bench.jsonl"
    done
    ;;
  q3n80b)
    TP=${BIG_TP:-$GPUS}
    Q=/dev/shm/deltaserve-q3n-80b
    # What /dev/shm cannot hold (less 16 GB of room) goes to SPILL_DIR on disk, linked from Q.
    SPILL=${SPILL_DIR:-$HOME/deltaserve-q3n-80b-spill}
    KEEP=$(($(df -B1 --output=avail /dev/shm | tail -1) - (16 << 30)))
    df -h /dev/shm / "$HOME" >"$OUT/q3n80b-write.log"
    free -g >>"$OUT/q3n80b-write.log"
    start=$(date +%s)
    random_q3n benches/configs/qwen3-next-80b-a3b.json $Q --spill "$SPILL" --keep-bytes "$KEEP" >>"$OUT/q3n80b-write.log" 2>&1
    echo "written in $(($(date +%s) - start)) s" >>"$OUT/q3n80b-write.log"
    du -shL $Q >>"$OUT/q3n80b-write.log"
    start=$(date +%s)
    if READY_SECS=420 start_server "$BIN/deltaserve" 18990 "$OUT/serve-q3n80b.log" --model $Q --device cuda --dtype bf16 --max-num-seqs 32 \
      --max-model-len 4096 --tensor-parallel-size "$TP" $GRAPH_FLAG; then
      echo "| load + warm-up to /ready | $(($(date +%s) - start)) s |" >>"$OUT/q3n80b.md"
      nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv >>"$OUT/q3n80b.md"
      timeout 120 "$BIN/serve_bench" --url http://127.0.0.1:18990 --num-prompts 64 --input-len 512 --output-len 128 --max-concurrency 16 --logprobs 0 \
        --label "q3n80b-tp$TP" --json "$OUT/q3n80b.json" | tail -3 | tee -a "$OUT/q3n80b.md"
      kill "$server_pid" 2>/dev/null; wait "$server_pid"
      echo "| server exit status after SIGTERM | $? |" >>"$OUT/q3n80b.md"
    fi
    ;;
  esac
done
log done

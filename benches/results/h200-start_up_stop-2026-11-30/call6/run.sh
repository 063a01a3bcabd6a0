#!/bin/bash
# Session 18, call 6 (two GPUs): (1) a SIGTERM during a fresh machine's first warm-up (the 1.39B,
# vocabulary 4,096): how long until the process exits; a second start warms up in full; (2) the
# GPU server at --tensor-parallel-size 2 against the CPU server over HTTP (gdn-attn, qwen3_5:
# concurrent completions, then two choices each); (3) the GPU suite and the tensor-parallel test.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/k9.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run44.sh $L/run.sh
nvidia-smi > $L/smi.txt
if ! ldconfig -p | grep -q libnccl.so.2; then
  NCCL_LIB=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0] + '/lib')")
  export LD_LIBRARY_PATH=$NCCL_LIB:${LD_LIBRARY_PATH:-}
fi
M=/tmp/gdn-v4096
python3 -c "import json; c = json.load(open('benches/configs/gdn-1.3b.json')); c['vocab_size'] = 4096; json.dump(c, open('/tmp/cfg.json', 'w'))"
/tmp/n/deltaserve init-random --config /tmp/cfg.json -o $M --dtype bf16 --tokenizer-from models/gdn-demo > $L/init.log 2>&1; echo "init rc=$?"
for i in 1 2; do
  f=$L/sigterm-$i.log
  /tmp/n/deltaserve serve --model $M --device cuda --dtype bf16 --port 18600 > $f 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do grep -q 'prefix cache' $f && break; sleep 0.1; done
  if [ $i = 1 ]; then
    sleep 1; s=$(date +%s.%N); kill -TERM $pid; wait $pid; rc=$?; e=$(date +%s.%N)
    echo "start 1: SIGTERM 1 s into the warm-up: exited rc=$rc after $(python3 -c "print(round($e - $s, 2))") s"
  else
    for _ in $(seq 1 600); do grep -q 'warmed up\|warm-up failed' $f && break; sleep 0.1; done
    s=$(date +%s.%N); kill -TERM $pid; wait $pid; rc=$?; e=$(date +%s.%N)
    echo "start 2: warmed up in full, then SIGTERM: exited rc=$rc after $(python3 -c "print(round($e - $s, 2))") s"
  fi
  sed 's/\x1b\[[0-9;]*m//g' $f | grep -o 'warm-up stopped.*\|warmed up.*\|shutdown during.*\|shut down.*' | cut -c1-200
done
for m in gdn-attn qwen3_5; do
  s=$(date +%s)
  LOGS=$L/tp-serve-$m GPU_FLAGS="--tensor-parallel-size 2" READY_SECS=240 timeout 400 bash scripts/gpu-serve-check.sh /tmp/n/deltaserve tests/fixtures/compact/$m > $L/tp-serve-$m.log 2>&1
  echo "tp serve $m rc=$? $(( $(date +%s) - s )) s"; grep "GPU serve check\|Error\|assert" $L/tp-serve-$m.log | tail -3
done
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
s=$(date +%s); DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests $T > $L/suite.log 2>&1
echo "suite rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|panicked" $L/suite.log | tail -5
s=$(date +%s); CUDA_MODULE_LOADING=EAGER DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests gpu_tensor_parallel_equals_one_gpu > $L/tp.log 2>&1
echo "tp rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|panicked" $L/tp.log | tail -3
cd $OUT && tar czf logs.tgz logs && rm -rf logs

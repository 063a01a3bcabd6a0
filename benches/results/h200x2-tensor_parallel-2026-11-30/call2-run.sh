#!/bin/bash
# Session 18, call 2 (two GPUs): the tensor-parallel test on gdn-attn alone, symbols kept for
# candle's error backtrace; on failure again with CUDA_LAUNCH_BLOCKING=1 and under
# compute-sanitizer; on success the whole test.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_MODULE_LOADING=EAGER RUST_BACKTRACE=1
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/k5.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run40.sh $L/run.sh
nvidia-smi > $L/smi.txt
if ! ldconfig -p | grep -q libnccl.so.2; then
  NCCL_LIB=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0] + '/lib')")
  export LD_LIBRARY_PATH=$NCCL_LIB:${LD_LIBRARY_PATH:-}
fi
t() { s=$(date +%s); DELTASERVE_TESTS_DIR=$PWD/tests timeout $1 "${@:3}" /tmp/n/gpu_tests gpu_tensor_parallel_equals_one_gpu > $L/$2.log 2>&1; rc=$?
  echo "$2 rc=$rc $(( $(date +%s) - s )) s"; grep -E "TP=|GPU tests|panicked|Error" $L/$2.log | cut -c1-250 | tail -12; return $rc; }
if DELTASERVE_TP_CASES=gdn-attn t 150 attn; then
  t 400 all
else
  DELTASERVE_TP_CASES=gdn-attn CUDA_LAUNCH_BLOCKING=1 t 150 attn-blocking
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  echo "sanitizer: $CS"
  [ -n "$CS" ] && DELTASERVE_TP_CASES=gdn-attn t 300 attn-sanitizer $CS --show-backtrace host --print-limit 20
fi
cd $OUT && tar czf logs.tgz logs && rm -rf logs

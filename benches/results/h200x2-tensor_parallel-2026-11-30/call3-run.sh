#!/bin/bash
# Session 18, call 3 (two GPUs): the tensor-parallel test with raw driver calls binding their
# context first (a split pool mirrors each rank's KV copy from one thread), then the rest of
# the GPU suite on GPU 0.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_MODULE_LOADING=EAGER RUST_BACKTRACE=1
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/k6.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run41.sh $L/run.sh
nvidia-smi > $L/smi.txt
if ! ldconfig -p | grep -q libnccl.so.2; then
  NCCL_LIB=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0] + '/lib')")
  export LD_LIBRARY_PATH=$NCCL_LIB:${LD_LIBRARY_PATH:-}
fi
s=$(date +%s); DELTASERVE_TESTS_DIR=$PWD/tests timeout 420 /tmp/n/gpu_tests gpu_tensor_parallel_equals_one_gpu > $L/tp.log 2>&1
echo "tp rc=$? $(( $(date +%s) - s )) s"; grep -E "TP=2|GPU tests|panicked|Error" $L/tp.log | grep -v "serving script$" | cut -c1-250 | tail -30
unset CUDA_MODULE_LOADING
T=$(grep -o '"gpu_[a-z0-9_]*",' tests/gpu.rs | tr -d '",' | grep -v tensor_parallel)
s=$(date +%s); DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests $T > $L/suite.log 2>&1
echo "suite rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|panicked" $L/suite.log | tail -5
cd $OUT && tar czf logs.tgz logs && rm -rf logs

#!/bin/bash
# Session 18, call 5 (two GPUs): the tensor-parallel test (MoE bf16 continuations held to twice the loosest call bound), raw driver calls binding their
# context first (a split pool mirrors each rank's KV copy from one thread).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_MODULE_LOADING=EAGER RUST_BACKTRACE=1
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/k8.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run43.sh $L/run.sh
nvidia-smi > $L/smi.txt
if ! ldconfig -p | grep -q libnccl.so.2; then
  NCCL_LIB=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0] + '/lib')")
  export LD_LIBRARY_PATH=$NCCL_LIB:${LD_LIBRARY_PATH:-}
fi
s=$(date +%s); DELTASERVE_TESTS_DIR=$PWD/tests timeout 420 /tmp/n/gpu_tests gpu_tensor_parallel_equals_one_gpu > $L/tp.log 2>&1
echo "tp rc=$? $(( $(date +%s) - s )) s"; grep -E "TP=2|GPU tests|panicked|Error" $L/tp.log | grep -v "serving script$" | cut -c1-250 | tail -30
cd $OUT && tar czf logs.tgz logs && rm -rf logs

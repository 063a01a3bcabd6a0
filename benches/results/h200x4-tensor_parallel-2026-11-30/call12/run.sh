#!/bin/bash
# Session 18, call 12 (four GPUs): the tensor-parallel test at TP 2 and 4 with the bf16 bound
# growing by half the unsplit error for each rank past the first, the MoE fixtures' by the unsplit run's worst call.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/k14.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run50.sh $L/run.sh
nvidia-smi > $L/smi.txt
if ! ldconfig -p | grep -q libnccl.so.2; then
  NCCL_LIB=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0] + '/lib')")
  export LD_LIBRARY_PATH=$NCCL_LIB:${LD_LIBRARY_PATH:-}
fi
s=$(date +%s); CUDA_MODULE_LOADING=EAGER RUST_BACKTRACE=1 DELTASERVE_TESTS_DIR=$PWD/tests timeout 400 /tmp/n/gpu_tests gpu_tensor_parallel_equals_one_gpu > $L/tp.log 2>&1
echo "tp rc=$? $(( $(date +%s) - s )) s"; grep -E "TP=|GPU tests|panicked" $L/tp.log | grep -v "serving script$" | cut -c1-230 | tail -40
cd $OUT && tar czf logs.tgz logs && rm -rf logs

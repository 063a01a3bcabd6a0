#!/bin/bash
# Session 17, call 8 (two GPUs): the SASS build's modules loaded into two contexts (each loaded outside the map's lock), through
# the tensor-parallel test (TP 2 against one GPU). NVLink multicast off, as KINDS.md asks.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The test binary cannot set this before its first CUDA call (engine's load_kernels_eagerly_for).
export CUDA_MODULE_LOADING=EAGER
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/k2.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run38.sh $L/run.sh
nvidia-smi --query-gpu=name --format=csv > $L/gpu.txt
if ! ldconfig -p | grep -q libnccl.so.2; then
  NCCL_LIB=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0] + '/lib')")
  export LD_LIBRARY_PATH=$NCCL_LIB:${LD_LIBRARY_PATH:-}
fi
s=$(date +%s)
DELTASERVE_TESTS_DIR=$PWD/tests timeout 150 /tmp/n/gpu_tests gpu_tensor_parallel_equals_one_gpu > $L/tests.log 2>&1
echo "tp rc=$? $(( $(date +%s) - s )) s"; grep -E "GPU tests|FAILED|panicked|TP" $L/tests.log | tail -8
cd $OUT && tar czf logs.tgz logs && rm -rf logs

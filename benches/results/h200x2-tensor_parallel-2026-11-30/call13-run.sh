#!/bin/bash
# Session 18, call 13 (two GPUs): the prefix cache's host tier with the model split over two
# GPUs (new test gpu_tensor_parallel_host_tier_round_trips), and the one-GPU host-tier test.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/k15.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run51.sh $L/run.sh
if ! ldconfig -p | grep -q libnccl.so.2; then
  NCCL_LIB=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0] + '/lib')")
  export LD_LIBRARY_PATH=$NCCL_LIB:${LD_LIBRARY_PATH:-}
fi
s=$(date +%s); CUDA_MODULE_LOADING=EAGER RUST_BACKTRACE=1 DELTASERVE_TESTS_DIR=$PWD/tests timeout 200 /tmp/n/gpu_tests gpu_tensor_parallel_host_tier_round_trips gpu_host_tier_round_trips_snapshots_exactly > $L/host_tier.log 2>&1
echo "rc=$? $(( $(date +%s) - s )) s"; grep -E "TP=|GPU tests|panicked|Error" $L/host_tier.log | cut -c1-230 | tail -12
cd $OUT && tar czf logs.tgz logs && rm -rf logs

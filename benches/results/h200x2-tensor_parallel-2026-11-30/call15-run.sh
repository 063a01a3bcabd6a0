#!/bin/bash
# Session 18, call 15 (two GPUs): the final tests on a build without the fix (raw driver calls
# not binding their GPU's context, as before bbf97c3): do they catch it?
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/o && tar -C /tmp/o -xJf .devbuild/k16.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run53.sh $L/run.sh
if ! ldconfig -p | grep -q libnccl.so.2; then
  NCCL_LIB=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0] + '/lib')")
  export LD_LIBRARY_PATH=$NCCL_LIB:${LD_LIBRARY_PATH:-}
fi
export CUDA_MODULE_LOADING=EAGER
s=$(date +%s); DELTASERVE_TESTS_DIR=$PWD/tests timeout 120 /tmp/o/gpu_tests gpu_tensor_parallel_host_tier_round_trips > $L/nofix-host_tier.log 2>&1
echo "host tier, no fix: rc=$? $(( $(date +%s) - s )) s"; grep -E "TP=|GPU tests|panicked|Error" $L/nofix-host_tier.log | cut -c1-200 | tail -4
s=$(date +%s); DELTASERVE_TP_CASES=gdn-attn DELTASERVE_TESTS_DIR=$PWD/tests timeout 120 /tmp/o/gpu_tests gpu_tensor_parallel_equals_one_gpu > $L/nofix-tp.log 2>&1
echo "tp gdn-attn, no fix: rc=$? $(( $(date +%s) - s )) s"; grep -E "TP=2|GPU tests|panicked|Error" $L/nofix-tp.log | grep -v "serving script$" | cut -c1-200 | tail -4
cd $OUT && tar czf logs.tgz logs && rm -rf logs

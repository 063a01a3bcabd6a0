#!/bin/bash
# Session 18, call 10 (four GPUs): the tensor-parallel test at TP 2 and 4 (raw driver calls
# binding their context; MoE bf16 continuations held to the logits bound), and the GPU server
# at --tensor-parallel-size 4 against the CPU server over HTTP (gdn-attn, qwen3_5).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/n && tar -C /tmp/n -xJf .devbuild/k12.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run48.sh $L/run.sh
nvidia-smi > $L/smi.txt
if ! ldconfig -p | grep -q libnccl.so.2; then
  NCCL_LIB=$(python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0] + '/lib')")
  export LD_LIBRARY_PATH=$NCCL_LIB:${LD_LIBRARY_PATH:-}
fi
s=$(date +%s); CUDA_MODULE_LOADING=EAGER RUST_BACKTRACE=1 DELTASERVE_TESTS_DIR=$PWD/tests timeout 400 /tmp/n/gpu_tests gpu_tensor_parallel_equals_one_gpu > $L/tp.log 2>&1
echo "tp rc=$? $(( $(date +%s) - s )) s"; grep -E "TP=4|GPU tests|panicked" $L/tp.log | grep -v "serving script$" | cut -c1-230 | tail -14
for m in gdn-attn qwen3_5; do
  s=$(date +%s)
  LOGS=$L/tp4-serve-$m GPU_FLAGS="--tensor-parallel-size 4" READY_SECS=240 timeout 300 bash scripts/gpu-serve-check.sh /tmp/n/deltaserve tests/fixtures/compact/$m > $L/tp4-serve-$m.log 2>&1
  echo "tp4 serve $m rc=$? $(( $(date +%s) - s )) s"; grep "GPU serve check\|Error\|assert" $L/tp4-serve-$m.log | tail -3
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

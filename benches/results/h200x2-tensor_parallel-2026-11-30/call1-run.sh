#!/bin/bash
# Session 18, call 1: the serving script on one GPU against the CPU, every fixture (test
# gpu_serving_script_matches_cpu), on the SASS build (`n`, da649a4) and on de38a4f's kernels
# (PTX through candle's module cache, `p`), EAGER and lazy module loading, and once with
# CUDA_LAUNCH_BLOCKING=1 to name the failing launch.
mkdir -p /tmp/n /tmp/p && tar -C /tmp/n -xJf .devbuild/k3.tar.xz && tar -C /tmp/p -xJf .devbuild/k4.tar.xz
L=$OUT/logs; mkdir -p $L; cp .devbuild/run39.sh $L/run.sh
nvidia-smi > $L/smi.txt
for v in n-eager p-eager n-lazy p-lazy n-eagerblock; do
  b=${v%%-*}; mode=${v##*-}
  s=$(date +%s)
  unset CUDA_LAUNCH_BLOCKING
  case $mode in eager) export CUDA_MODULE_LOADING=EAGER;; lazy) unset CUDA_MODULE_LOADING;; eagerblock) export CUDA_MODULE_LOADING=EAGER CUDA_LAUNCH_BLOCKING=1;; esac
  DELTASERVE_TESTS_DIR=$PWD/tests RUST_BACKTRACE=1 timeout 90 /tmp/$b/gpu_tests gpu_serving_script_matches_cpu --nocapture > $L/$v.log 2>&1
  echo "$v rc=$? $(( $(date +%s) - s )) s"; grep -E "serving script|GPU tests|panicked|Error|error" $L/$v.log | cut -c1-250 | tail -8
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs

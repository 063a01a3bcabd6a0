// What the standalone CUDA probes of benches/ share.
#pragma once
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>

// A CUDA call that must succeed: its error and place printed, the probe ended.
#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

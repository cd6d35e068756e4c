// BASALT_CUDA_CHECK: turns a CUDA runtime error into basalt::Error.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

#define BASALT_CUDA_CHECK(call)                                                                   \
  do {                                                                                            \
    const cudaError_t basalt_cuda_status = (call);                                                \
    if (basalt_cuda_status != cudaSuccess)                                                        \
      ::basalt::fail("CUDA error in {} at {}:{}: {}", #call, __FILE__, __LINE__,                  \
                     cudaGetErrorString(basalt_cuda_status));                                     \
  } while (0)

// See kernel_caps.h.
#include "backend/cuda/kernel_caps.h"

#include <cuda_runtime_api.h>

namespace basalt::cuda_kernels {

bool wgmma_available() {
#if defined(BASALT_CUDA_SM90A)
  static const bool available = [] {
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
      return false;
    return major == 9 && minor == 0;
  }();
  return available;
#else
  return false;
#endif
}

}  // namespace basalt::cuda_kernels

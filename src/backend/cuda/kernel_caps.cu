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

int sm_count() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 132;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) return 132;
  return sms;
}

}  // namespace basalt::cuda_kernels

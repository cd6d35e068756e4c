#include "backend/cuda/device.h"

#include <cuda_runtime_api.h>

#include <memory>

#include "backend/cuda/cuda_check.h"

namespace basalt {

bool cuda_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return count > 0;
}

Tensor cuda_empty(Shape shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  void* data = nullptr;
  if (bytes > 0) BASALT_CUDA_CHECK(cudaMalloc(&data, bytes));
  std::shared_ptr<void> owner(data, [](void* p) {
    if (p != nullptr) (void)cudaFree(p);
  });
  return Tensor::wrap(data, std::move(shape), dtype, std::move(owner), Device::kCuda);
}

Tensor cuda_to_device(const Tensor& host) {
  BASALT_CHECK(host.device() == Device::kCpu, "cuda_to_device: {} is not a host tensor", host.describe());
  Tensor out = cuda_empty(host.shape(), host.dtype());
  if (host.nbytes() > 0) BASALT_CUDA_CHECK(cudaMemcpy(out.raw(), host.raw(), host.nbytes(), cudaMemcpyHostToDevice));
  return out;
}

Tensor cuda_to_host(const Tensor& device) {
  BASALT_CHECK(device.device() == Device::kCuda, "cuda_to_host: {} is not a device tensor", device.describe());
  Tensor out = Tensor::empty(device.shape(), device.dtype());
  if (device.nbytes() > 0)
    BASALT_CUDA_CHECK(cudaMemcpy(out.raw(), device.raw(), device.nbytes(), cudaMemcpyDeviceToHost));
  return out;
}

void cuda_fill_bytes(Tensor& t, int byte) {
  BASALT_CHECK(t.device() == Device::kCuda, "cuda_fill_bytes: {} is not a device tensor", t.describe());
  if (t.nbytes() > 0) BASALT_CUDA_CHECK(cudaMemset(t.raw(), byte, t.nbytes()));
}

void cuda_synchronize() { BASALT_CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace basalt

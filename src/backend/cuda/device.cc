#include "backend/cuda/device.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

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

namespace {

// Blocks freed by tensors are kept per rounded size and handed out again.
// Every op of the backend runs on one stream, in order, so a block released
// by a tensor whose last kernel is still queued may be reused by a kernel
// queued later: the stream orders the two. (A second stream would need
// events before reuse.)
class BlockCache {
 public:
  static BlockCache& instance() {
    static BlockCache* cache = new BlockCache();  // never destroyed: tensors may outlive statics
    return *cache;
  }

  void* take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= bytes;
        return p;
      }
    }
    void* p = nullptr;
    cudaError_t status = cudaMalloc(&p, bytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_all();  // give cached blocks back and try once more
      status = cudaMalloc(&p, bytes);
    }
    BASALT_CUDA_CHECK(status);
    return p;
  }

  void give(void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[bytes].push_back(p);
    cached_bytes_ += bytes;
  }

  void release_all() {
    std::lock_guard<std::mutex> lock(mu_);
    (void)cudaDeviceSynchronize();
    for (auto& [bytes, blocks] : free_)
      for (void* p : blocks) (void)cudaFree(p);
    free_.clear();
    cached_bytes_ = 0;
  }

 private:
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_bytes_ = 0;
};

// Sizes round up to 512 B below 1 MiB and to 2 MiB above, so blocks are
// reused across slightly different shapes.
size_t rounded(size_t bytes) {
  const size_t unit = bytes < (1u << 20) ? 512 : (2u << 20);
  return (bytes + unit - 1) / unit * unit;
}

}  // namespace

Tensor cuda_empty(Shape shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  if (bytes == 0) return Tensor::wrap(nullptr, std::move(shape), dtype, nullptr, Device::kCuda);
  const size_t size = rounded(bytes);
  void* data = BlockCache::instance().take(size);
  std::shared_ptr<void> owner(data, [size](void* p) { BlockCache::instance().give(p, size); });
  return Tensor::wrap(data, std::move(shape), dtype, std::move(owner), Device::kCuda);
}

void cuda_release_cached_memory() { BlockCache::instance().release_all(); }

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

size_t cuda_free_memory() {
  size_t free = 0, total = 0;
  BASALT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

size_t cuda_total_memory() {
  size_t free = 0, total = 0;
  BASALT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return total;
}

}  // namespace basalt

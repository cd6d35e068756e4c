#include "backend/cuda/device.h"

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace basalt {

bool cuda_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return count > 0;
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

namespace {

// Blocks freed by tensors are kept per owner and rounded size and handed
// out again to the same owner. An owner is a backend (one stream): its ops
// run in order, so a block released by a tensor whose last kernel is still
// queued may be reused by a kernel the same backend queues later. Another
// backend on the same GPU (tensor-parallel ranks sharing one GPU in tests)
// runs on another stream, which nothing orders with this one, so it never
// gets the block.
class BlockCache {
 public:
  // One cache per GPU: a block goes back to the cache of the device it was
  // allocated on, whichever thread frees it.
  static constexpr int kMaxDevices = 64;
  static BlockCache& of(int device) {
    static std::mutex mu;
    static BlockCache* caches[kMaxDevices] = {};  // never destroyed: tensors may outlive statics
    BASALT_CHECK(device >= 0 && device < kMaxDevices, "CUDA device {} out of range", device);
    std::lock_guard<std::mutex> lock(mu);
    if (caches[device] == nullptr) caches[device] = new BlockCache();
    return *caches[device];
  }
  static int current_device() {
    int device = 0;
    BASALT_CUDA_CHECK(cudaGetDevice(&device));
    return device;
  }

  // pool 0 is the general cache; pool 1 holds the blocks of recorded graphs
  // (see CudaGraphPoolScope in device.h) and never lends to pool 0.
  void* take(size_t bytes, int pool, uint32_t owner) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& free = free_[pool];
      auto it = free.find({owner, bytes});
      if (it != free.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        return p;
      }
    }
    void* p = nullptr;
    cudaError_t status = cudaMalloc(&p, bytes);
    if (status == cudaErrorMemoryAllocation && pool == 0) {
      (void)cudaGetLastError();
      release_all();  // give cached blocks back and try once more
      status = cudaMalloc(&p, bytes);
    }
    BASALT_CUDA_CHECK(status);
    return p;
  }

  void give(void* p, size_t bytes, int pool, uint32_t owner) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[pool][{owner, bytes}].push_back(p);
  }

  // Frees the general cache's blocks; graph blocks stay (recorded graphs
  // still point at them).
  void release_all() {
    std::lock_guard<std::mutex> lock(mu_);
    (void)cudaDeviceSynchronize();
    for (auto& [key, blocks] : free_[0])
      for (void* p : blocks) (void)cudaFree(p);
    free_[0].clear();
  }

 private:
  std::mutex mu_;
  std::map<std::pair<uint32_t, size_t>, std::vector<void*>> free_[2];  // by (owner, bytes)
};

thread_local int t_pool = 0;         // the pool this thread allocates from
thread_local uint32_t t_owner = 0;  // and for whom (CudaAllocationOwner)

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
  const int pool = t_pool;
  const uint32_t whose = t_owner;
  const int device = BlockCache::current_device();
  void* data = BlockCache::of(device).take(size, pool, whose);
  std::shared_ptr<void> owner(data, [size, pool, device, whose](void* p) {
    BlockCache::of(device).give(p, size, pool, whose);
  });
  return Tensor::wrap(data, std::move(shape), dtype, std::move(owner), Device::kCuda);
}

void cuda_release_cached_memory() { BlockCache::of(BlockCache::current_device()).release_all(); }

CudaAllocationOwner::CudaAllocationOwner(uint32_t owner) : previous_(t_owner) { t_owner = owner; }
CudaAllocationOwner::~CudaAllocationOwner() { t_owner = previous_; }

CudaGraphPoolScope::CudaGraphPoolScope() : previous_(t_pool) { t_pool = 1; }
CudaGraphPoolScope::~CudaGraphPoolScope() { t_pool = previous_; }

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

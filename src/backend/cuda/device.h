// Device memory and transfers for the CUDA backend.
//
// Contract: cuda_empty returns a Tensor of Device::kCuda on the thread's
// current device (256-byte aligned,
// contents uninitialised) whose block returns to a cache when the last handle
// to it goes, for the next cuda_empty of the same rounded size by the same
// owner (CudaAllocationOwner): reuse is safe because a backend runs every op
// on one stream, in order (see device.cc).
// When cudaMalloc runs out, the cache is released and the allocation retried. cuda_to_device / cuda_to_host copy a whole
// contiguous tensor and return when the copy is complete. Every CUDA failure
// throws basalt::Error naming the call, the file and line, and CUDA's
// message. cuda_available() tells, without throwing, whether a usable device
// is present (tests that need one skip when it is not, so CPU-only machines
// compile and run the test binaries).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace basalt {

bool cuda_available();
// How many CUDA devices this process sees (0 when none, without throwing).
int cuda_device_count();
Tensor cuda_empty(Shape shape, DType dtype);
Tensor cuda_to_device(const Tensor& host);
Tensor cuda_to_host(const Tensor& device);
// Fills the tensor's bytes with `byte` (0xFF makes every f32/bf16 a NaN:
// tests poison outputs with it).
void cuda_fill_bytes(Tensor& t, int byte);
void cuda_synchronize();
// Free and total memory of the current device, in bytes.
size_t cuda_free_memory();
size_t cuda_total_memory();
// Frees the current device's cached blocks (after synchronising it).
void cuda_release_cached_memory();

// While one of these lives, cuda_empty on this thread allocates for
// `owner` (a backend, CudaBackend::allocation_owner()): blocks go back to
// that owner's cache and only it gets them again, since only its stream is
// ordered with their last use. 0, the default, is the owner of threads that
// name none.
class CudaAllocationOwner {
 public:
  explicit CudaAllocationOwner(uint32_t owner);
  ~CudaAllocationOwner();
  CudaAllocationOwner(const CudaAllocationOwner&) = delete;
  CudaAllocationOwner& operator=(const CudaAllocationOwner&) = delete;

 private:
  uint32_t previous_;
};

// While one of these lives, cuda_empty on this thread takes blocks from the
// graph pool: blocks that recorded CUDA graphs may point at. A graph-pool
// block, once freed, is lent again only to graph-pool allocations, never to
// ordinary tensors, and is never returned to CUDA. So the scratch memory of
// a recorded graph is never memory some live tensor owns when the graph
// replays, while graphs recorded one after another (and replayed one at a
// time on the one stream) share their scratch blocks.
class CudaGraphPoolScope {
 public:
  CudaGraphPoolScope();
  ~CudaGraphPoolScope();
  CudaGraphPoolScope(const CudaGraphPoolScope&) = delete;
  CudaGraphPoolScope& operator=(const CudaGraphPoolScope&) = delete;

 private:
  int previous_;
};

}  // namespace basalt

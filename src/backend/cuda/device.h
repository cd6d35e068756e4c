// Device memory and transfers for the CUDA backend.
//
// Contract: cuda_empty returns a Tensor of Device::kCuda whose memory (from
// cudaMalloc, 256-byte aligned) is freed when the last handle to it goes;
// the contents are uninitialised. cuda_to_device / cuda_to_host copy a whole
// contiguous tensor and return when the copy is complete. Every CUDA failure
// throws basalt::Error naming the call, the file and line, and CUDA's
// message. cuda_available() tells, without throwing, whether a usable device
// is present (tests that need one skip when it is not, so CPU-only machines
// compile and run the test binaries).
//
// This is the first layer of the CUDA backend: the allocator will become a
// caching, stream-ordered one when the backend runs whole models.
#pragma once

#include "core/tensor.h"

namespace basalt {

bool cuda_available();
Tensor cuda_empty(Shape shape, DType dtype);
Tensor cuda_to_device(const Tensor& host);
Tensor cuda_to_host(const Tensor& device);
// Fills the tensor's bytes with `byte` (0xFF makes every f32/bf16 a NaN:
// tests poison outputs with it).
void cuda_fill_bytes(Tensor& t, int byte);
void cuda_synchronize();

}  // namespace basalt

// Device-side element conversions shared by the kernels: every kernel loads
// its storage type into f32 with to_f32 and stores with from_f32<T> (round
// to nearest even). For .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>

namespace basalt::cuda_kernels {

using bf16 = __nv_bfloat16;

// A quiet NaN (what poisoned rows are written as), and log2(e) for kernels
// that keep softmax scores in the log2 domain.
__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }
constexpr float kLog2e = 1.4426950408889634f;

// 2^x by ex2.approx.ftz (-inf gives 0; relative error ~2^-22): the softmax
// exponent of the tensor-core attention kernels.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}

// Programmatic dependent launch (sm_90). A kernel launched with the
// programmatic-serialization attribute may start while the kernel before it
// in the stream still runs; it must call wait_for_producer() before it reads
// anything that kernel (or an earlier one) writes, and it may do work that
// needs none of it before (the GEMVs stream their weights). A kernel calls
// let_consumer_start() to allow such a successor to launch before it ends
// (a no-op when the successor was launched normally).
//
// What an earlier kernel writes is never read through a `const T*
// __restrict__` parameter in such a kernel: the compiler reads those through
// the read-only path (ld.global.nc), which promises the data does not change
// while the kernel runs, and may then issue the loads before the wait. (A
// GEMV of two rows did, on the H200: the blocks that started early read the
// input before the kernel before it had written it.) Weights may stay
// __restrict__; activations, ids and scales from earlier kernels may not.
__device__ __forceinline__ void wait_for_producer() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void let_consumer_start() { asm volatile("griddepcontrol.launch_dependents;"); }

// Launches `kernel` with the programmatic-serialization attribute (see
// above): the kernel must call wait_for_producer() before it touches memory
// an earlier kernel writes.
// launch_dependent_smem also gives the block `smem` bytes of dynamic shared
// memory.
template <typename... Params, typename... Args>
cudaError_t launch_dependent_smem(void (*kernel)(Params...), dim3 blocks, dim3 threads, size_t smem,
                                  cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = blocks;
  config.blockDim = threads;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

template <typename... Params, typename... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 blocks, dim3 threads, cudaStream_t stream,
                             Args... args) {
  return launch_dependent_smem(kernel, blocks, threads, 0, stream, args...);
}

}  // namespace basalt::cuda_kernels

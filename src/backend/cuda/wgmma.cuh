// Hopper's warpgroup MMA (wgmma, sm_90a) for the FP8 GEMMs and the MLA decode
// core: shared-memory matrix descriptors, the fences and groups around the
// asynchronous MMA, and the tile shapes the kernels use: m64n128k32 with
// e4m3 operands (the MoE GEMMs), m64n32k16 and m64n256k16 with bf16 operands
// (the MLA decode core), m64n64k16 and m64n128k16 with bf16 operands, B from
// shared memory or A from registers (the attention prefill), all with f32
// accumulators. Device code only: include from .cu files.
//
// Contract:
//  * Every wrapper is one PTX instruction as the PTX ISA documents it (9.7.15,
//    "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"); none adds
//    synchronisation beyond its own. All four warps of a warpgroup (128
//    consecutive threads, the first a multiple of 128) execute them together.
//  * Operands in shared memory are K-major (rows of K, as activations [M, K]
//    and Hugging Face weights [N, K] are stored; wgmma_desc_sw128_mn is the
//    one MN-major exception) in the 128-byte swizzle: rows
//    of 128 bytes, 16-byte chunk c of row r at byte r * 128 + ((c ^ (r % 8)) *
//    16), from a 1024-byte-aligned base (the XOR is taken on address bits, so
//    the base must be aligned for the pattern to mean the same thing to the
//    writer and to the MMA). The 32 bytes of K of one step (k32 e4m3, k16
//    bf16) start 32 bytes further along the row: desc + 2 (the address field
//    counts 16 bytes).
//  * Accumulators of m64nN, f32: thread t of the warpgroup holds d[4 j + i]
//    = D[16 (t / 32) + t % 32 / 4 + 8 (i / 2), 8 j + 2 (t % 4) + i % 2] for
//    j < N / 8, i < 4 (the mma.sync m16n8 layout, repeated over n).
//  * wgmma_wait<0>() then wgmma_fence_operands(d) before reading d: the
//    fence keeps the compiler from moving reads of d above the wait.
//  * Compiled only for sm_90a (BASALT_WGMMA is 1 there); elsewhere the
//    wrappers trap, and callers choose another kernel (kernel_caps.h:
//    wgmma_available()).
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define BASALT_WGMMA 1
#else
#define BASALT_WGMMA 0
#endif

namespace basalt::cuda_kernels {

// The asm operand lists of N f32 accumulators d[0 .. N), read and written.
#define BASALT_WGMMA_ACC8(d, i)                                                                                  \
  "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), \
      "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define BASALT_WGMMA_ACC16_AT(d, i) BASALT_WGMMA_ACC8(d, i), BASALT_WGMMA_ACC8(d, (i) + 8)
#define BASALT_WGMMA_ACC32_AT(d, i) BASALT_WGMMA_ACC16_AT(d, i), BASALT_WGMMA_ACC16_AT(d, (i) + 16)
#define BASALT_WGMMA_ACC64_AT(d, i) BASALT_WGMMA_ACC32_AT(d, i), BASALT_WGMMA_ACC32_AT(d, (i) + 32)
#define BASALT_WGMMA_ACC16(d) BASALT_WGMMA_ACC16_AT(d, 0)
#define BASALT_WGMMA_ACC32(d) BASALT_WGMMA_ACC32_AT(d, 0)
#define BASALT_WGMMA_ACC64(d) BASALT_WGMMA_ACC64_AT(d, 0)
#define BASALT_WGMMA_ACC128(d) BASALT_WGMMA_ACC64_AT(d, 0), BASALT_WGMMA_ACC64_AT(d, 64)

// Descriptor of a K-major, 128-byte-swizzled operand at shared address
// `addr` (1024-byte-aligned tile base plus the k offset): start address,
// stride between 8-row groups 1024 bytes, layout 1 (128B swizzle). The
// leading offset is unused in this layout (K of one MMA fits in a row).
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1024 >> 4) << 32) |
         (static_cast<uint64_t>(1) << 62);
}

// Descriptor of an MN-major, 128-byte-swizzled operand (each k a row of MN
// elements, as the value tile of attention is stored: keys x features) at
// shared address `addr`: swizzle atoms of 8 rows x 128 bytes, `lbo` bytes
// from one atom to the next 128 bytes of MN and `sbo` bytes to the next 8
// rows of k (the PTX ISA's leading and stride byte offsets for MN-major
// layouts; CUTLASS's make_gmma_desc<Major::MN> names them the same way).
__device__ __forceinline__ uint64_t wgmma_desc_sw128_mn(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (static_cast<uint64_t>(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() {
#if BASALT_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if BASALT_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
// Waits until at most N committed groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if BASALT_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#else
  __trap();
#endif
}
// Makes this thread's generic-proxy writes to shared memory (st.shared,
// cp.async) visible to the async proxy that wgmma reads through.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if BASALT_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  __trap();
#endif
}

template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d = (accumulate ? d : 0) + A B^T, A 64 x 32 e4m3 at desc_a, B 128 x 32
// e4m3 at desc_b (both K-major), asynchronously: d is the warpgroup's until
// the wgmma_wait that covers this MMA's group.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                      bool accumulate) {
#if BASALT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1;\n}\n"
      : BASALT_WGMMA_ACC64(d)
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
#else
  __trap();
#endif
}

// d = (accumulate ? d : 0) + A B^T for bf16 operands, A 64 x 16 at desc_a, B
// 32 x 16 at desc_b (both K-major, 128-byte swizzle), f32 accumulators.
__device__ __forceinline__ void wgmma_m64n32k16_bf16(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                                     bool accumulate) {
#if BASALT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : BASALT_WGMMA_ACC16(d)
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
#else
  __trap();
#endif
}

// d = (accumulate ? d : 0) + A B for bf16 operands, A 64 x 16 in registers
// (a[0..3]: the mma.sync m16n8k16 A fragment of rows 16 w .. 16 w + 15 for
// warp w of the warpgroup: the accumulator layout above, converted), B 16 x
// 256 at desc_b MN-major (rows of 256 along N, one per k: wgmma_desc_sw128_mn).
__device__ __forceinline__ void wgmma_m64n256k16_bf16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b,
                                                         bool accumulate) {
#if BASALT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : BASALT_WGMMA_ACC128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
#else
  __trap();
#endif
}

// d = (accumulate ? d : 0) + A B^T for bf16 operands, A 64 x 16 at desc_a, B
// 64 x 16 at desc_b (both K-major, 128-byte swizzle), f32 accumulators.
__device__ __forceinline__ void wgmma_m64n64k16_bf16(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                     bool accumulate) {
#if BASALT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : BASALT_WGMMA_ACC32(d)
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
#else
  __trap();
#endif
}

// d = (accumulate ? d : 0) + A B^T for bf16 operands, A 64 x 16 at desc_a, B
// 128 x 16 at desc_b (both K-major, 128-byte swizzle), f32 accumulators.
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                     bool accumulate) {
#if BASALT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : BASALT_WGMMA_ACC64(d)
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
#else
  __trap();
#endif
}

// d = (accumulate ? d : 0) + A B for bf16 operands, A 64 x 16 in registers
// (as wgmma_m64n256k16_bf16_rs), B 16 x 64 at desc_b MN-major.
__device__ __forceinline__ void wgmma_m64n64k16_bf16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                                        bool accumulate) {
#if BASALT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : BASALT_WGMMA_ACC32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
#else
  __trap();
#endif
}

// d = (accumulate ? d : 0) + A B for bf16 operands, A 64 x 16 in registers
// (as wgmma_m64n256k16_bf16_rs), B 16 x 128 at desc_b MN-major.
__device__ __forceinline__ void wgmma_m64n128k16_bf16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                                        bool accumulate) {
#if BASALT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : BASALT_WGMMA_ACC64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
#else
  __trap();
#endif
}

}  // namespace basalt::cuda_kernels

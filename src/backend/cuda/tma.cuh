// Hopper's tensor memory accelerator (TMA, sm_90a) and the mbarriers that
// count its bytes: what a warp-specialized kernel needs to have one thread
// stream tiles into shared memory while warpgroups compute on them. Device
// code only: include from .cu files; tensor maps are encoded on the host
// (tensor_map.h).
//
// Contract:
//  * Each wrapper is one PTX instruction as the PTX ISA documents it
//    (cp.async.bulk.tensor, mbarrier, fence.proxy.tensormap, setmaxnreg),
//    except cluster_sync (barrier.cluster's arrive and wait) and
//    mbarrier_arrive_cluster (the mapa that names the other CTA's barrier,
//    then the arrival); none adds synchronisation beyond its own.
//  * Barriers are named by their shared-memory address (8 bytes, 8-aligned).
//    A phase completes when `count` arrivals (mbarrier_init) have come and
//    every byte announced with mbarrier_arrive_expect_tx has landed; waits
//    name the phase by its parity. A fresh barrier counts as having completed
//    the phase of parity 1, so a producer's first wait on "empty" passes.
//  * tma_load_2d copies the box of a 2-D tensor map at {c0 (innermost, in
//    elements), c1 (rows)} into shared memory at `dst` (aligned to the map's
//    swizzle span: 1024 bytes for the 128-byte swizzle) and counts its bytes
//    on `bar`; elements outside the tensor arrive as zeros and are counted.
//  * A tensor map in global memory written by an earlier kernel (a generic
//    store) is read by TMA through another proxy: tensormap_acquire on its
//    address orders the two before its first use in a kernel.
//  * Clusters: tma_load_2d_multicast writes one box into several CTAs of a
//    cluster; mbarrier_arrive_cluster arrives on a barrier of another CTA;
//    cluster_sync is the cluster-wide block barrier. A CTA whose shared
//    memory or barriers others may still write must not exit before they
//    are done (the caller's protocol says when).
//  * setmaxnreg moves registers between the warpgroups of a block: one
//    gives some back (dec) so that others may take more (inc).
//  * Compiled only for sm_90a (BASALT_WGMMA, wgmma.cuh); elsewhere the
//    wrappers trap, and callers choose another kernel.
#pragma once

#include <cstdint>

#include "backend/cuda/wgmma.cuh"

namespace basalt::cuda_kernels {

__device__ __forceinline__ void mbarrier_init(uint32_t bar, int count) {
#if BASALT_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#else
  __trap();
#endif
}

// Makes mbarrier_init visible to the other threads and to the async proxy
// (TMA's arrivals); call between the inits and the block barrier after them.
__device__ __forceinline__ void mbarrier_init_fence() {
#if BASALT_WGMMA
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
#if BASALT_WGMMA
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#else
  __trap();
#endif
}

// One arrival that also announces `bytes` more to land in this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if BASALT_WGMMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#else
  __trap();
#endif
}

// Spins until the phase of `parity` has completed (acquire).
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
#if BASALT_WGMMA
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
#else
  __trap();
#endif
}

__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, int32_t c0, int32_t c1, uint32_t bar) {
#if BASALT_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
#else
  __trap();
#endif
}

// The same copy delivered to every CTA of the cluster named in cta_mask (bit
// i: rank i), at the same shared address `dst` in each, counting its bytes
// on each one's barrier at address `bar`: one read from L2 for all of them.
__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const void* map, int32_t c0, int32_t c1,
                                                      uint32_t bar, uint16_t cta_mask) {
#if BASALT_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask)
      : "memory");
#else
  __trap();
#endif
}

// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_cta_rank() {
#if BASALT_WGMMA
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
#else
  __trap();
  return 0;
#endif
}

// Every thread of every CTA of the cluster arrives (release) and waits
// (acquire) for all of them: e.g. barriers initialised before any CTA
// arrives on another's.
__device__ __forceinline__ void cluster_sync() {
#if BASALT_WGMMA
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

// One arrival on the barrier at shared address `bar` of the cluster's CTA
// `rank` (this CTA's own included), with the instruction's default
// semantics (release at CTA scope), as CUTLASS's cluster barriers arrive: a
// consumer that only read the stage has nothing to publish, and the
// cluster-scope release measured about 1 us a stage (bench/README.md).
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t bar, uint32_t rank) {
#if BASALT_WGMMA
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
#else
  __trap();
#endif
}

// Hands registers back (dec) or takes more (inc): every thread of the
// warpgroup runs it with the same N, a multiple of 8 in [24, 256]; the
// block's warpgroups together must fit the SM's register file.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#if BASALT_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#else
  __trap();
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#if BASALT_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#else
  __trap();
#endif
}

__device__ __forceinline__ void tensormap_acquire(const void* map) {
#if BASALT_WGMMA
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(map) : "memory");
#else
  __trap();
#endif
}

}  // namespace basalt::cuda_kernels

// The CPU kernel for bf16 weights: out = x · wᵀ with the activations rounded
// to bf16, as core/bf16_product.h defines the product.
//
// Contract: linear_bf16_f32 computes out[t, n] = bf16_dot_reference(round(x
// row t), w row n, in) for host, row-major, contiguous x [tokens, in] f32,
// w [outs, in] bf16 and out [tokens, outs] f32, spread over the pool; the
// bias is the caller's. Every kernel (AVX-512 BF16, the AVX2 and scalar
// emulations) gives the definition's bits for every token count and thread
// count. Arguments are trusted; out must not overlap x or w.
//
// The activations are rounded once per call into a per-thread buffer, half
// the bytes of f32 rows (a decode step's 8,192-column row is 16 KiB, which
// stays in L1 beside the streaming weights). Two regimes, as in linear.h: few tokens stream the weight rows one at
// a time from memory, every token row of a group of four reusing each
// loaded chunk; many tokens take tiles of 4 token rows × 6
// weight rows (AVX-512) over whole rows, the weight rows read in place (the
// checkpoint's bf16 pairs are already the instruction's operand layout, so
// nothing is packed or converted) and kept in cache while the token rows of
// a 128-token block stream past them.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace basalt::cpu {

void linear_bf16_f32(ThreadPool& pool, const float* x, int64_t tokens, int64_t in, const uint16_t* w,
                     int64_t outs, float* out);

}  // namespace basalt::cpu

// The CPU kernel for integer-format weights (core/int_weights.h): int8 and
// packed int4 codes with f16 group scales.
//
// Contract: linear_int_f32 computes out[t, n] = the product core/int_weights.h
// defines (the activations quantized per block of 32 columns, exact integer
// block dot products, summed into f32 in the fixed order given there) plus
// bias[n] when bias is not null, for host, row-major, contiguous x [tokens,
// K] f32 and out [tokens, outs] f32, codes and scales laid out as the layout
// says, spread over the pool. Every token row and every kernel (AVX-512 VNNI,
// AVX2, scalar) gives the bits of int_dot_reference, so the op is
// batch-invariant. Arguments are trusted (Backend::linear_int checks them).
//
// The arithmetic is integer: per block of 32 columns byte products (AVX2
// maddubs + madd, or one VNNI dpbusd), four to a 32-bit lane, then one f32
// multiply-add per lane and block by the block's scale product (computed
// once per weight row and token row). int8 multiplies the weight codes'
// magnitudes by x codes carrying their signs; int4 multiplies its stored
// nibbles (code + 8) by the x codes and starts each lane at -8 times the
// lane's x codes summed (computed once per call), which is exact. A weight
// row's codes and scales are read once per tile of four token rows; with
// few tokens (decode) the kernel is a stream over the codes, half (int8) or
// a quarter (int4) of the bytes of bf16 weights.
#pragma once

#include <cstdint>

#include "core/int_weights.h"
#include "core/thread_pool.h"

namespace basalt::cpu {

void linear_int_f32(ThreadPool& pool, const float* x, int64_t tokens, const IntWeightLayout& layout,
                    const void* codes, const uint16_t* scales, int64_t outs, const float* bias, float* out);

}  // namespace basalt::cpu

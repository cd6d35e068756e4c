// The CPU kernel for integer-format weights (core/int_weights.h): int8 and
// packed int4 codes with f16 group scales.
//
// Contract: linear_int_f32 computes out[t, n] = the product core/int_weights.h
// defines (the activations quantized per block of 32 columns, exact integer
// block dot products, summed into f32 in the fixed order given there) plus
// bias[n] when bias is not null, for host, row-major, contiguous x [tokens,
// K] f32 and out [tokens, outs] f32, codes and scales laid out as the layout
// says, spread over the pool. Every token row and every kernel (AMX,
// AVX-512 VNNI, AVX-VNNI, AVX2, scalar) gives the bits of int_dot_reference,
// so the op is batch-invariant. Arguments are trusted (Backend::linear_int
// checks them).
//
// The arithmetic is integer. Decode-sized calls (up to four token rows)
// take a group of weight rows at a time, rows in vector lanes: per block of
// 32 columns byte products summed into 32-bit lanes (AVX2 maddubs + madd,
// or VNNI dpbusd), the lanes then summed across to each row's exact block
// sum, and one f32 multiply-add per row and block; the group's codes are
// read once for every token row. Over interleaved rows (core/int_weights.h,
// which CpuBackend::prepare_int_weight makes where it pays) a register
// holds a word of each of 8 rows, so the lanes are the rows' sums with no
// sum across them: that kernel takes calls of every size there. Larger calls on a CPU with AMX (where
// Linux grants it) multiply tiles of 16 weight rows by 16 token rows, which
// gives the block sums directly. int8 on VNNI multiplies code + 128 and
// int4 its stored nibbles (code + 8) as unsigned bytes and subtract the
// offset times the block's activation sum (computed once per call), which
// is exact; int8 on plain AVX2 multiplies the weights' magnitudes by
// activations carrying their signs.
#pragma once

#include <cstdint>

#include "core/int_weights.h"
#include "core/thread_pool.h"

namespace basalt::cpu {

void linear_int_f32(ThreadPool& pool, const float* x, int64_t tokens, const IntWeightLayout& layout,
                    const void* codes, const uint16_t* scales, int64_t outs, const float* bias, float* out);

// Whether this build and machine read interleaved rows (core/int_weights.h)
// faster than rows one after another: where the decode kernel takes groups
// of 8 rows (AVX2 builds, and AVX-512 builds on AMD's cores, where the
// 512-bit kernel is not taken) and no AMX kernel takes the larger calls (it
// reads rows in place). Every kernel takes either layout and gives the same
// bits; this is only about speed.
bool linear_int_interleave_pays();

// A weight's codes and scales row by row to codes_out and scales_out,
// interleaved (core/int_weights.h's interleave_int_rows), the groups spread
// over the pool.
void interleave_int_weight(ThreadPool& pool, const IntWeightLayout& layout, int64_t rows, const void* codes,
                           const uint16_t* scales, void* codes_out, uint16_t* scales_out);

// Whether this build and machine can take the AMX kernel (compiled for it,
// the CPU has AMX-INT8, and Linux granted the tile state).
bool linear_int_amx_available();

// Lets calls take the AMX kernel (the default) or not, for benchmarks and
// tests that compare it with the vector kernels. Process-wide.
void linear_int_allow_amx(bool allow);

}  // namespace basalt::cpu

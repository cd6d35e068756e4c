// CPU kernels for block-wise FP8 weights and for reading single weight rows.
//
// Contract: linear_fp8_block_f32 computes out[t, n] = sum_k x[t, k] *
// (f32(w[n, k]) * scale_inv[n / 128, k / 128]) for host, row-major,
// contiguous x [tokens, in], w f8_e4m3 [outs, in], scale_inv f32
// [ceil(outs/128), ceil(in/128)] and out [tokens, outs], spread over the pool.
// Weights are dequantized on the fly (in registers for few tokens, a few rows
// at a time into per-thread scratch for many), never as a whole copy. e4m3 NaN
// encodings (0x7f, 0xff) are not produced by quantizers and are read as 480.
// Both ways dequantize to the same f32 values (code * scale, rounded once)
// and sum them in linear_f32's fixed order, so a token's output row has the
// same bits whatever the token count (batch-invariant).
//
// The row helpers read one row n of a LinearWeight of any supported dtype
// (f32, bf16, f16, or f8_e4m3 with block scales): dot with a vector, add a
// multiple to a vector, or convert the row to f32. linear_weight_f32 is the
// linear op over a LinearWeight of either kind. Arguments are trusted.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/linear.h"
#include "core/thread_pool.h"

namespace basalt::cpu {

void linear_fp8_block_f32(ThreadPool& pool, const float* x, int64_t tokens, int64_t in,
                          const uint8_t* w, const float* scale_inv, int64_t outs, float* out);

// out [tokens, N] = x [tokens, K] · wᵀ for a LinearWeight w [N, K]; bf16
// weights as linear_f32 takes them.
void linear_weight_f32(ThreadPool& pool, const float* x, int64_t tokens, const LinearWeight& w,
                       float* out, Bf16Activations bf16_activations = Bf16Activations::kRounded);

// sum_k x[k] * w[n, k] over the row's K columns.
float weight_row_dot(const LinearWeight& w, int64_t n, const float* x);
// y[k] += a * w[n, k] for the row's K columns.
void weight_row_axpy(const LinearWeight& w, int64_t n, float a, float* y);
// dst[k] = w[n, k] as f32.
void weight_row_f32(const LinearWeight& w, int64_t n, float* dst);

}  // namespace basalt::cpu

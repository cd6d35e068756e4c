// The CPU linear kernel: out = x · wᵀ (+ bias) for f32 activations.
//
// Contract: linear_f32 computes out[t, n] = sum_k x[t, k] * w[n, k] + bias[n]
// for row-major, contiguous, host x [tokens, in], w [outs, in] (f32, f16 or
// f8_e4m3) and out [tokens, outs], with f32 products of exactly converted
// weights and f32 accumulation, spread over the pool. bf16 weights go to
// bf16_linear.h (the activations rounded to bf16, core/bf16_product.h) and
// get the same bias, unless the caller asks for f32 activations
// (Bf16Activations::kF32: then they are summed as the other dtypes are).
// Arguments are trusted (CpuBackend validates them); out must not overlap x
// or w.
//
// Two regimes, because decode and prefill have opposite bottlenecks:
//  * few tokens (decode, small batches): the op is a streaming read of w, so
//    each thread walks its share of weight rows once, converting bf16/f16 in
//    registers and feeding up to four token rows per pass over the weights;
//  * many tokens (prefill): the op is compute bound, so each thread copies
//    a panel of weight rows (a K-block of a few rows) once into an
//    L1-resident scratch buffer, as f32 (f16 weights stay f16 where F16C
//    converts them in registers), and reuses it against every token row with
//    a register-blocked microkernel (4 token rows × 6 weight rows with
//    AVX-512), while the next panel's weights are prefetched.
// Both regimes take the weights in the checkpoint layout, so no repacking is
// needed at load time.
//
// Batch invariance: both regimes sum each output element in one fixed order
// that depends on `in` alone (K-blocks of at most 1024 columns; per block one
// vector accumulator over the block's lanes, then a horizontal sum; block
// sums added left to right), so out[t, n] has the same bits whatever the
// token count, the other token rows, the regime and the thread count.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/thread_pool.h"

namespace basalt::cpu {

// How bf16 weights meet the activations: rounded to bf16 (the linear op's
// definition), or kept in f32 where a caller must agree with another f32 path
// (MLA's expanded keys and values against the absorbed attention).
enum class Bf16Activations { kRounded, kF32 };

// The mode `--dtype auto` takes on this build: kRounded where the bf16
// product runs on the AVX-512 BF16 instruction (at or above llama.cpp's
// bf16 prefill there), kF32 elsewhere, where rounding costs an emulation of
// that instruction's order and f32 activations meet weights converted once
// per panel (AVX2 prefill 1.7x faster, bench/README.md).
Bf16Activations auto_bf16_activations();

// bias may be null; otherwise bias_dtype is f32, bf16 or f16.
void linear_f32(ThreadPool& pool, const float* x, int64_t tokens, int64_t in, const void* w,
                DType w_dtype, int64_t outs, const void* bias, DType bias_dtype, float* out,
                Bf16Activations bf16_activations = Bf16Activations::kRounded);

// The token count from which linear_f32 switches to the panel regime.
int64_t linear_panel_min_tokens();

// The few-token regime over block-FP8 weights w f8_e4m3 [outs, in] with
// scale_inv f32 [ceil(outs/128), ceil(in/128)], dequantized in registers to
// exactly the f32 values code * scale (one rounding), summed in linear_f32's
// order: the same bits as linear_f32 on the dequantized f32 rows.
void linear_fp8_block_direct(ThreadPool& pool, const float* x, int64_t tokens, int64_t in,
                             const uint8_t* w, const float* scale_inv, int64_t outs, float* out);

}  // namespace basalt::cpu

// The product of f32 activations with bf16 weights, as every CPU path
// (the CPU backend's kernels on any instruction set, and the reference ops)
// computes it: the activations rounded to bf16, exact bf16 products summed
// in f32 in one fixed order, which is the order of AVX-512 BF16's pair dot
// product (vdpbf16ps) so that instruction runs it at full rate.
//
// Definition, for one activation row x [K] (f32) and one weight row w [K]
// (bf16 bits):
//  * x is rounded to bf16 (round to nearest even, as f32_to_bf16; NaN stays
//    NaN; values below 2^-126 in magnitude become zero of the same sign) and
//    zero-padded, with w, to P = bf16_padded_columns(K) columns;
//  * 16 f32 lanes start at +0; for each chunk of 32 columns c in order and
//    each lane j, with o = c + 2j + 1 and e = c + 2j:
//      acc[j] = acc[j] + x[o] * w[o];  then  acc[j] = acc[j] + x[e] * w[e]
//    (the products of two bf16 values are exact in f32; each add rounds to
//    nearest even);
//  * out = t_0 + t_1 with v_j = acc[j] + acc[j + 8] (j < 8), u_j = v_j +
//    v_{j+4} (j < 4), t_j = u_j + u_{j+2} (j < 2).
// The result depends on K alone, never on how many rows are computed
// together or on which kernel runs: the op is batch-invariant. There are no
// K-blocks (as linear.h's f32 kernels have): one lane sum per output over
// the whole row costs a sixth of the reductions of 1024-column blocks, which
// made the 64-token products 10-25% faster, and bf16 rows are small enough
// to stream from L2.
//
// Where it may differ: vdpbf16ps flushes bf16 inputs and f32 results below
// 2^-126 to zero, which the emulations (AVX2, scalar) do not; activations
// are flushed when they are rounded, so only a weight, product or partial
// sum that small (none in a trained model's linear layers) can part them.
//
// Rounding the activations to bf16 is what bf16 matmuls do on GPUs and in
// llama.cpp; it halves the activation bytes the kernels read and lets AVX-512
// BF16 do 32 multiply-adds per instruction. Weights in f32, f16 and FP8 keep
// f32 activations (backend/cpu/linear.h).
#pragma once

#include <cstdint>

namespace basalt {

inline constexpr int64_t kBf16Chunk = 32;  // columns per chunk: 16 lanes of pairs

// K rounded up to a multiple of 32.
inline int64_t bf16_padded_columns(int64_t k) { return (k + kBf16Chunk - 1) / kBf16Chunk * kBf16Chunk; }

// One activation rounded as defined above.
uint16_t round_activation_bf16(float x);

// Writes bf16_padded_columns(k) values: x rounded as defined above, then zeros.
void round_activations_bf16(const float* x, int64_t k, uint16_t* out);

// The definition for one rounded, padded activation row and one weight row
// of k columns (only k are read). The scalar reference the kernels match.
float bf16_dot_reference(const uint16_t* x_rounded, const uint16_t* w, int64_t k);

}  // namespace basalt

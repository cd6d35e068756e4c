// Integer weight formats for the CPU: int8 and int4 codes with f16 scales.
//
// A linear weight W [N, K] ([out_features, in_features]) is stored as codes
// and one f16 scale per group of `group` consecutive input columns of a row:
// value = code * scale. `group` is a multiple of 32, or K itself (one scale
// per row: "per channel"). Codes are laid out in blocks of 32 input columns,
// the last block of a row padded with zero codes:
//  * int8: codes i8 [N, blocks(K) * 32], each in [-127, 127];
//  * int4: codes u8 [N, blocks(K) * 16]; in block b byte i holds column
//    32 b + i in its low nibble and column 32 b + 16 + i in its high nibble,
//    each as code + 8 with code in [-8, 7] (llama.cpp's Q4_0 order, which
//    unpacks to the block's columns in order with one mask and one shift);
//  * scales f16 [N, ceil(K / group)].
// Quantizing a group: int8 takes scale = f16(amax / 127) and code =
// round-to-nearest-even(w / scale) clamped to [-127, 127]; int4 takes the
// element v of largest magnitude (the first on ties), scale = f16(v / -8)
// (so v itself maps to -8 and the 16 levels cover the group's range) and
// code = rne(w / scale) clamped to [-8, 7]. An all-zero group has scale 0
// and codes 0. A weight that is not finite is refused.
//
// The product (Backend::linear_int) quantizes each row of the activations
// x [T, K] in blocks of 32 columns (zero-padded): amax = the largest |x|
// (NaN never wins), a_scale = amax / 127, code = rne(clamp(x * (127 / amax),
// -127, 127)) with the clamp taking NaN to -127, all in f32; an all-zero
// block has a_scale 0 and codes 0. Then out[t, n] is summed in one fixed
// order that every implementation reproduces bit for bit: acc = 0, and for
// each block b in order
//   P = the exact integer sum of the block's 32 products x_code * w_code,
//   s = a_scale[t, b] * w_scale[n, 32 b / group] (one f32 product),
//   acc = fma(float(P), s, acc)   (|P| <= 32 * 127 * 127 < 2^24: exact),
// and out = acc (+ bias[n]). Whole-block sums are what a tile multiply
// (Intel's AMX) gives, and a vector kernel gets them by summing the rows'
// 32-bit lanes across, so every kernel reproduces them; the result is the
// same for any token count, thread count or kernel (batch invariance).
//
// Rows interleaved (IntWeightLayout::rows_interleaved; a backend's own
// layout, never a checkpoint's): the codes tensor keeps its shape and bytes,
// but each full group of kIntInterleaveRows = 8 rows [8g, 8g + 8) is stored
// block by block instead of row by row. Block b of group g takes the 8 *
// block bytes at 8g * code_columns + 8b * block bytes, and holds each
// 4-byte word q of the eight rows' block b side by side: its byte 32q + 4i +
// j is byte 4q + j of row 8g + i's block b. So 32 bytes hold one word of
// eight rows, and a multiply-add of bytes into 32-bit lanes against one
// broadcast word of the activations leaves each row's share in a lane of
// its own, with no sum across lanes. The scales [N, scale_columns] are
// interleaved alike: group g's 8 * scale_columns scales (at 8g *
// scale_columns) hold, for each scale column c in order, that column of the
// eight rows (scale 8c + i is row 8g + i's column c), so one 16-byte load
// gives a block's eight row scales. The last N mod 8 rows stay row by row
// after the groups, codes and scales.
#pragma once

#include <cstdint>
#include <string>

namespace basalt {

inline constexpr int64_t kIntBlock = 32;  // input columns per code block

struct IntWeightLayout {
  int bits = 0;             // 8 or 4; 0: not an integer format
  int64_t group = 0;        // input columns per scale (a multiple of 32, or in_features)
  int64_t in_features = 0;  // K
  bool rows_interleaved = false;  // codes in groups of 8 rows (above)

  int64_t blocks() const { return (in_features + kIntBlock - 1) / kIntBlock; }
  // Columns of the codes tensor: bytes per row.
  int64_t code_columns() const { return blocks() * (bits == 4 ? kIntBlock / 2 : kIntBlock); }
  int64_t scale_columns() const { return (in_features + group - 1) / group; }
};

// Which layouts are valid: bits 8 or 4, in_features >= 1, and group a
// positive multiple of 32 or equal to in_features. Empty when valid; else
// what is wrong.
std::string int_layout_error(const IntWeightLayout& layout);

// Quantizes one row of K f32 weights into codes (layout.code_columns()
// bytes: i8 for int8, packed u8 for int4) and scales (f16 bits,
// layout.scale_columns()). Throws basalt::Error on a weight that is not
// finite.
void quantize_int_row(const IntWeightLayout& layout, const float* w, void* codes, uint16_t* scales);

// The f32 value of column k of a quantized row (code * scale).
float dequantize_int(const IntWeightLayout& layout, const void* codes, const uint16_t* scales, int64_t k);

// The code of column k of a quantized row.
int int_code(const IntWeightLayout& layout, const void* codes, int64_t k);

inline constexpr int64_t kIntInterleaveRows = 8;

// codes [rows, code_columns] and scales [rows, scale_columns] row by row
// to codes_out and scales_out (the same sizes, not overlapping the inputs)
// with rows interleaved, as described above.
void interleave_int_rows(const IntWeightLayout& layout, int64_t rows, const void* codes, const uint16_t* scales,
                         void* codes_out, uint16_t* scales_out);

// Row n's codes (code_columns() bytes) and scales (scale_columns()) out of
// tensors of `rows` rows in the layout's order, interleaved or not.
void int_row(const IntWeightLayout& layout, int64_t rows, const void* codes, const uint16_t* scales, int64_t n,
             void* codes_out, uint16_t* scales_out);

// Quantizes one row of K activations into codes [blocks * 32] (zero-padded)
// and per-block scales [blocks], as the product above defines.
void quantize_int_activations(const float* x, int64_t K, int8_t* codes, float* block_scales);

// out = the product above for one activation row (already quantized) and one
// weight row, without the bias. The scalar definition; the CPU kernels
// reproduce its bits.
float int_dot_reference(const IntWeightLayout& layout, const int8_t* x_codes, const float* x_scales,
                        const void* w_codes, const uint16_t* w_scales);

}  // namespace basalt

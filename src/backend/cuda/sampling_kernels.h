// Launchers of the sampling kernels (sampling_kernels.cu): the device
// sampler, logit edits, per-row top-k and gather, with a plain interface (raw
// device pointers and sizes) so that the .cu file needs no host-library
// headers. sampling.h is the checked API on top; call that instead.
//
// Contract: each launcher enqueues its kernels on `stream` and returns
// cudaGetLastError() (cudaSuccess when the launches were accepted). Sizes and
// controls are trusted: the caller has checked shapes, dtypes, placement and
// values, and has laid out the records below exactly like SamplingRow and
// LogitEdit (backend.h; sampling.cc checks the layouts at compile time).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace basalt::cuda_kernels {

// SamplingRow's layout.
struct SampleControls {
  float temperature;
  int top_k;
  float top_p;
  float min_p;
  uint64_t seed;
  uint64_t step;
};

// LogitEdit's layout.
struct EditRecord {
  int32_t row;
  int32_t token;
  float bias;
  float repetition;
  float subtract;
  bool suppress;
};

// One token per row of logits f32 [rows, cols] under controls[rows] (device
// memory), into out i32 [rows]. keys (u32) and weights (f32) are device
// scratch of rows * cols elements each. Masses are summed as integers:
// weight * 2^mass_shift rounded, so mass_shift must be at most 44 and keep
// cols * 2^mass_shift below 2^63.
cudaError_t sample(const float* logits, const SampleControls* controls, uint32_t* keys, float* weights,
                   int32_t* out, int64_t rows, int64_t cols, int mass_shift, cudaStream_t stream);
// Applies edits[count] (device memory) to logits f32 [rows, cols].
// logits[r, t] = -inf where bit t % 32 of bitmask[r, t / 32] is clear.
cudaError_t apply_token_bitmask(float* logits, const int32_t* bitmask, int64_t rows, int64_t cols,
                                cudaStream_t stream);
cudaError_t adjust_logits(float* logits, const EditRecord* edits, int64_t count, int64_t cols,
                          cudaStream_t stream);
// Per row of x f32 [rows, cols], the k largest (k <= 64) into values f32 and
// ids i32 [rows, k].
cudaError_t top_k_rows(const float* x, int64_t rows, int64_t cols, int k, float* values, int32_t* ids,
                       cudaStream_t stream);
// out[r] = x[r, cols[r]] (NaN where cols[r] is outside [0, num_cols)).
cudaError_t gather_rows(const float* x, const int32_t* cols, float* out, int64_t rows, int64_t num_cols,
                        cudaStream_t stream);
// out[r] = 1 + the entries of row r greater than x[r, cols[r]] (0 where
// cols[r] is outside [0, num_cols)).
cudaError_t rank_rows(const float* x, const int32_t* cols, int32_t* out, int64_t rows,
                      int64_t num_cols, cudaStream_t stream);
// dst[dst_index[k]] = src[src_index[k]] for k < count; a pair with an index
// outside [0, src_len) or [0, dst_len) is skipped.
cudaError_t copy_indexed(const int32_t* src, const int32_t* src_index, int64_t src_len, int32_t* dst,
                         const int32_t* dst_index, int64_t dst_len, int64_t count, cudaStream_t stream);

}  // namespace basalt::cuda_kernels

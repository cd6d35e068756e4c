// Launchers of the elementwise kernels (elementwise_kernels.cu), with a plain
// interface: raw device pointers, element-type codes and sizes, so that the
// .cu file needs no host-library headers (nvcc's front end cannot compile
// fmt). elementwise.h is the checked API on top; call that instead.
//
// Contract: each launcher enqueues one kernel on `stream` and returns
// cudaGetLastError() (cudaSuccess when the launch was accepted). Sizes are
// trusted: the caller has checked shapes, dtypes and placement.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace basalt::cuda_kernels {

enum class Elem : int { kF32, kBF16, kF16 };

cudaError_t embedding(Elem act, Elem table, const int32_t* ids, const void* table_data, void* out, int64_t tokens,
                      int64_t vocab, int64_t hidden, cudaStream_t stream);
// With residual non-null: residual += x first, then normalise residual.
// x and residual are `act`; out is `out_elem` (f32 or bf16).
cudaError_t rms_norm(Elem act, Elem out_elem, Elem weight, void* residual, const void* x, const void* weight_data,
                     void* out, int64_t rows, int64_t hidden, float eps, cudaStream_t stream);
// gate_up is `act`, out `out_elem` (f32 or bf16).
cudaError_t silu_and_mul(Elem act, Elem out_elem, const void* gate_up, void* out, int64_t tokens, int64_t inter,
                         cudaStream_t stream);
cudaError_t add(Elem act, const void* a, const void* b, void* out, int64_t n, cudaStream_t stream);
cudaError_t rope(Elem act, void* x, const int32_t* positions, const float* inv_freq, int64_t tokens, int heads,
                 int head_dim, int rotary, int offset, bool interleaved, float scaling, cudaStream_t stream);

// The fused attention input stage (Backend::qkv_rope_store): qkv [tokens,
// (num_heads + 2 num_kv_heads) head_dim]; q_norm / k_norm null or [head_dim]
// of one dtype (`norm`); head_dim <= 256.
struct QkvRopeStoreArgs {
  const void* qkv;
  const void* q_norm;
  const void* k_norm;
  float eps;
  const int32_t* positions;
  const float* inv_freq;
  int rotary, offset;
  bool interleaved;
  float scaling;
  int num_heads, num_kv_heads, head_dim;
  const int32_t* slots;
  int64_t num_slots;
  void* k_cache;
  void* v_cache;
  void* q_out;
};
cudaError_t qkv_rope_store(Elem in, Elem q_out, Elem cache, Elem norm, const QkvRopeStoreArgs& args, int64_t tokens,
                           cudaStream_t stream);

// Reads bytes [p, p + bytes) once and keeps nothing (a value that cannot
// come up is the only write, to *sink): evicts other data from L2 without
// leaving dirty lines behind, as a benchmark's cache flush must. p is
// 16-byte aligned and bytes a multiple of 16.
cudaError_t read_through(const void* p, int64_t bytes, uint32_t* sink, cudaStream_t stream);

// out[i] = in[i] converted (round to nearest even).
cudaError_t cast(Elem from, Elem to, const void* in, void* out, int64_t n, cudaStream_t stream);
// Row-wise over f32 [rows, cols]: softmax, or log_softmax when `log`.
cudaError_t softmax(const float* x, float* out, int64_t rows, int64_t cols, bool log, cudaStream_t stream);
// Row-wise index of the largest value; NaN skipped, ties to the lowest
// index, a row of NaN gives 0.
cudaError_t argmax(const float* x, int32_t* out, int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace basalt::cuda_kernels

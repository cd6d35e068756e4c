// Row-wise and elementwise kernels of the CUDA backend: embedding, rms_norm,
// add_rms_norm, silu_and_mul, add and rope, with the semantics of the Backend
// op of the same name (backend/backend.h, backend/reference_ops.h).
//
// Contract:
//  * Every tensor is on the device (Device::kCuda) and contiguous. Activations
//    (x, out, residual, gate_up, a, b) are f32 or bf16, one dtype per call
//    except that rms_norm, add_rms_norm and silu_and_mul may write an out of
//    the other one (f32 residual stream in, bf16 input of a linear out);
//    embedding tables and norm weights are f32, bf16 or f16; positions and
//    ids are i32; inv_freq is f32. Shapes and dtypes are checked on the host
//    and a mismatch throws basalt::Error before anything is launched.
//  * Arithmetic is f32 whatever the storage: a bf16 result is the f32 result
//    rounded to nearest even. rms_norm follows Hugging Face's LlamaRMSNorm:
//    y = x * rsqrt(mean(x^2) + eps) in f32, rounded to the activation dtype,
//    then multiplied by the weight. add_rms_norm stores residual + x (rounded
//    to the activation dtype) into residual, then normalises it.
//  * rope computes angle = float(position) * inv_freq[i] as one f32 multiply
//    (as the reference and Hugging Face do), so its result differs from the
//    reference only by cosf/sinf's last bits.
//  * embedding does not read ids back to the host (that would cost a
//    synchronisation per step): a row whose id is outside [0, V) is written
//    as NaN. The engine validates every id before it reaches the model.
//  * Launches go to `stream` (the default stream when null) and return at
//    once; nothing here synchronises.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "core/tensor.h"

namespace basalt {

void cuda_embedding(const Tensor& ids, const Tensor& table, Tensor& out, cudaStream_t stream = nullptr);
void cuda_rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out, cudaStream_t stream = nullptr);
void cuda_add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out,
                       cudaStream_t stream = nullptr);
void cuda_silu_and_mul(const Tensor& gate_up, Tensor& out, cudaStream_t stream = nullptr);
void cuda_add(const Tensor& a, const Tensor& b, Tensor& out, cudaStream_t stream = nullptr);
void cuda_rope(Tensor& x, const Tensor& positions, const RopeParams& params, cudaStream_t stream = nullptr);
// Backend::qkv_rope_store in one kernel: qkv f32 or bf16; q_out f32 or bf16;
// caches f32 or bf16 (one dtype); head_dim <= 256.
void cuda_qkv_rope_store(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                         const Tensor& positions, const RopeParams& rope, int num_heads, int num_kv_heads,
                         const Tensor& slots, Tensor& k_cache, Tensor& v_cache, Tensor& q_out,
                         cudaStream_t stream = nullptr);
// Element-type conversion between f32, bf16 and f16 (same shape).
void cuda_cast(const Tensor& in, Tensor& out, cudaStream_t stream = nullptr);
// f32 [rows, cols] row-wise softmax / log_softmax, as the reference computes
// them (max-shifted, in f32 here).
void cuda_softmax(const Tensor& x, Tensor& out, bool log, cudaStream_t stream = nullptr);
// f32 [rows, cols] -> i32 [rows]: the reference's argmax rules (NaN skipped,
// ties to the lowest index, all-NaN rows give 0).
void cuda_argmax(const Tensor& logits, Tensor& out, cudaStream_t stream = nullptr);

}  // namespace basalt

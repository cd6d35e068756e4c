// The checked host API of the device sampler and its companions
// (sampling_kernels.cu): Backend::sample, adjust_logits, top_k_rows and
// gather_rows for the CUDA backend.
//
// Contract:
//  * Tensors are on the device; controls and edits are host spans, uploaded
//    in one host-to-device copy each (cudaMemcpyAsync from pageable memory,
//    which has taken the bytes when it returns). Nothing here waits for the
//    device: the calls enqueue work on `stream` and return.
//  * cuda_sample computes what reference::sample specifies, one block per
//    row: temperature (IEEE division), top-k and top-p as rank cuts found by
//    radix select over an order-preserving key of the scaled logit (ties to
//    the lower index), min-p, then the draw with sampling_uniform(seed,
//    step) in index order. Greedy rows are the argmax. The weights are
//    exp(s - m) computed in double and rounded to f32, which is the host's
//    expf result except in its rare last-bit misses. Masses are summed as
//    integers (w * 2^44 rounded, fewer bits for vocabularies over 2^18), so
//    the top-p mass before a token and the draw's running sums differ from
//    the reference's double sums by at most ~1e-8 relative: a draw differs
//    from the CPU backend's only where u * Z' (or top_p * Z, or a weight
//    against min_p) lies within that of a boundary. Deterministic: the same
//    logits and controls give the same tokens run after run.
//  * Controls and edits are validated as the reference validates them and
//    bad ones throw before anything is enqueued; ids that cannot be checked
//    without reading the device (gather_rows' and rank_rows' cols) give NaN
//    and 0 instead.
#pragma once

#include <cuda_runtime_api.h>

#include <span>

#include "backend/backend.h"

namespace basalt {

void cuda_sample(const Tensor& logits, std::span<const SamplingRow> rows, Tensor& out, cudaStream_t stream);
void cuda_adjust_logits(Tensor& logits, std::span<const LogitEdit> edits, cudaStream_t stream);
void cuda_apply_token_bitmask(Tensor& logits, const Tensor& bitmask, cudaStream_t stream);
void cuda_top_k_rows(const Tensor& x, int k, Tensor& values, Tensor& ids, cudaStream_t stream);
void cuda_gather_rows(const Tensor& x, const Tensor& cols, Tensor& out, cudaStream_t stream);
void cuda_rank_rows(const Tensor& x, const Tensor& cols, Tensor& out, cudaStream_t stream);
void cuda_copy_indexed(const Tensor& src, const Tensor& src_index, Tensor& dst, const Tensor& dst_index,
                       cudaStream_t stream);

}  // namespace basalt

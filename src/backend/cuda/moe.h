// Mixture-of-experts ops of the CUDA backend. For now: the router.
//
// cuda_moe_route is Backend::moe_route (backend.h) on the device:
//  * logits f32 [T, E]; bias null or f32 [E]; ids i32 [T, top_k]; weights
//    f32 [T, top_k]; all on the device (Device::kCuda). Limits: E <= 256,
//    num_groups <= 32 (dividing E), top_k <= 32, besides the Backend's own
//    (0 < topk_groups <= num_groups, top_k <= topk_groups * E / num_groups).
//    Anything else throws basalt::Error before a launch. T = 0 launches
//    nothing.
//  * It computes the CPU backend's f32 arithmetic step for step (see
//    moe_kernels.cu), with exp taken in double and rounded to f32 and the
//    softmax denominator summed in double in another order. So its ids equal
//    the CPU backend's except where two candidates' scores lie within an f32
//    ulp or so of each other at a selection boundary, and its weights agree
//    to about 1e-7 relative (bit for bit wherever the scores do).
//  * Non-finite logits or bias give valid, distinct expert ids (a NaN choice
//    ranks as -inf) but an order the CPU backend need not share.
//  * Enqueued on `stream` (the default stream when null); nothing waits.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "core/tensor.h"

namespace basalt {

void cuda_moe_route(const Tensor& logits, const Tensor* bias, const MoeRouteParams& params, Tensor& ids,
                    Tensor& weights, cudaStream_t stream = nullptr);

}  // namespace basalt

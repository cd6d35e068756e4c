// Row-wise argmax and sampling for the CPU backend.
//
// Contract: argmax_row and sample_row compute exactly what
// reference::argmax / reference::sample define (backend/reference_ops.h) for
// one row, bit for bit: the same float scaling, the same std::exp weights and
// the same double sums in the same orders, so the CPU backend and the
// reference pick the same token for every (logits, controls, seed, step).
// They are faster only in what they avoid: top-k keeps a bounded heap instead
// of sorting the vocabulary, top-p sorts just the head of the distribution
// (every token of weight >= 2^-12, widening only if that head holds less than
// top_p of the mass), and exp is skipped for tokens no filter can keep.
// Controls are trusted (CpuBackend validates them). Thread-safe.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace basalt::cpu {

int32_t argmax_row(const float* row, int64_t n);
int32_t sample_row(const float* logits, int64_t n, const SamplingRow& controls);

}  // namespace basalt::cpu

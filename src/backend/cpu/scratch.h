// Per-thread scratch memory for the CPU kernels.
//
// Contract: scratch_floats(slot, n) returns 64-byte aligned room for at least
// n floats that belongs to the calling thread, so kernels running on the
// pool's workers never allocate in their inner loops and never share it. The
// memory stays valid until the same thread asks for the same slot again and
// is freed when the thread exits. Contents are unspecified on return.
#pragma once

#include <cstddef>

namespace basalt::cpu {

enum class ScratchSlot { kLinearPanel, kAttentionKeys, kAttentionValues, kAttentionScores, kCount };

float* scratch_floats(ScratchSlot slot, size_t n);

}  // namespace basalt::cpu

// Per-thread scratch memory for the CPU kernels.
//
// Contract: scratch_bytes(slot, n) returns 64-byte aligned room for at least
// n bytes (scratch_floats: n floats) that belongs to the calling thread, so
// kernels running on the pool's workers never allocate in their inner loops
// and never share it. The memory stays valid until the same thread asks for
// the same slot again and is freed when the thread exits. Contents are
// unspecified on return.
#pragma once

#include <cstddef>

namespace basalt::cpu {

enum class ScratchSlot { kLinearPanel, kAttentionKeys, kAttentionValues, kAttentionScores, kCount };

void* scratch_bytes(ScratchSlot slot, size_t bytes);
inline float* scratch_floats(ScratchSlot slot, size_t n) {
  return static_cast<float*>(scratch_bytes(slot, n * sizeof(float)));
}

}  // namespace basalt::cpu

#include "backend/cpu/scratch.h"

#include <algorithm>
#include <array>

#include "core/error.h"

namespace basalt::cpu {
namespace {

struct ScratchBuffer {
  void* data = nullptr;
  size_t capacity = 0;
  ~ScratchBuffer() { std::free(data); }
};

}  // namespace

void* scratch_bytes(ScratchSlot slot, size_t n) {
  thread_local std::array<ScratchBuffer, static_cast<size_t>(ScratchSlot::kCount)> buffers;
  ScratchBuffer& buffer = buffers[static_cast<size_t>(slot)];
  if (buffer.capacity < n) {
    // Grow geometrically so a slowly growing context does not reallocate per call.
    const size_t capacity = std::max(n, buffer.capacity * 2);
    std::free(buffer.data);
    buffer.data = nullptr;
    buffer.capacity = 0;
    const size_t bytes = (capacity + 63) / 64 * 64;
    buffer.data = std::aligned_alloc(64, bytes);
    BASALT_CHECK(buffer.data != nullptr, "out of memory for {} bytes of kernel scratch", bytes);
    buffer.capacity = capacity;
  }
  return buffer.data;
}

}  // namespace basalt::cpu

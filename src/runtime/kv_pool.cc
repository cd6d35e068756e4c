#include "runtime/kv_pool.h"

#include <unistd.h>

#include <limits>

#include "core/error.h"

namespace basalt {

KvPool::KvPool(int64_t capacity, int32_t page_size)
    : capacity_(capacity), page_size_(page_size), free_slots_(capacity) {
  BASALT_CHECK(page_size >= 1, "KV pool: page size must be at least 1, got {}", page_size);
  BASALT_CHECK(capacity > 0 && capacity % page_size == 0,
               "KV pool: capacity {} must be a positive multiple of the page size {}", capacity,
               page_size);
  BASALT_CHECK(capacity - 1 <= std::numeric_limits<int32_t>::max(),
               "KV pool: capacity {} exceeds what an i32 slot index can name", capacity);
  const int64_t pages = capacity / page_size;
  free_pages_.reserve(static_cast<size_t>(pages));
  for (int64_t p = pages - 1; p >= 0; --p) free_pages_.push_back(static_cast<int32_t>(p));
  allocated_.assign(static_cast<size_t>(capacity), 0);
  page_in_use_.assign(static_cast<size_t>(pages), 0);
}

int64_t KvPool::slots_for_budget(size_t bytes_per_slot, size_t budget_bytes, int32_t page_size) {
  BASALT_CHECK(bytes_per_slot > 0, "KV pool: a slot must take at least one byte");
  BASALT_CHECK(page_size >= 1, "KV pool: page size must be at least 1, got {}", page_size);
  const uint64_t max_slots = static_cast<uint64_t>(std::numeric_limits<int32_t>::max()) + 1;
  uint64_t slots = budget_bytes / bytes_per_slot;
  if (slots > max_slots) slots = max_slots;
  slots -= slots % static_cast<uint64_t>(page_size);
  return static_cast<int64_t>(slots);
}

size_t KvPool::host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGE_SIZE);
  BASALT_CHECK(pages > 0 && page_bytes > 0, "KV pool: cannot read this host's memory size");
  return static_cast<size_t>(pages) * static_cast<size_t>(page_bytes);
}

size_t KvPool::host_memory_budget(double fraction) {
  BASALT_CHECK(fraction > 0.0 && fraction <= 1.0,
               "KV pool: memory fraction must be in (0, 1], got {}", fraction);
  return static_cast<size_t>(static_cast<double>(host_memory_bytes()) * fraction);
}

int64_t KvPool::rounded(int64_t n) const {
  return (n + page_size_ - 1) / page_size_ * page_size_;
}

bool KvPool::is_page_aligned(std::span<const int32_t> slots) const {
  for (size_t p = 0; p < slots.size(); ++p) {
    const auto offset = static_cast<int32_t>(p % static_cast<size_t>(page_size_));
    if (slots[p] < 0 || slots[p] % page_size_ != offset) return false;
    if (offset != 0 && slots[p] != slots[p - 1] + 1) return false;
  }
  return true;
}

std::optional<std::vector<int32_t>> KvPool::allocate(int64_t n) {
  std::vector<int32_t> slots;
  if (!allocate_into(n, slots)) return std::nullopt;
  return slots;
}

bool KvPool::allocate_into(int64_t n, std::vector<int32_t>& slots) {
  BASALT_CHECK(n > 0, "KV pool: cannot allocate {} slots", n);
  const int64_t pages = (n + page_size_ - 1) / page_size_;
  if (pages > free_pages()) return false;
  for (int64_t i = 0; i < pages; ++i) {
    const int32_t page = free_pages_.back();
    free_pages_.pop_back();
    page_in_use_[static_cast<size_t>(page)] = page_size_;
    const int32_t first = page * page_size_;
    for (int32_t o = 0; o < page_size_; ++o) {
      allocated_[static_cast<size_t>(first + o)] = 1;
      slots.push_back(first + o);
    }
  }
  free_slots_ -= pages * page_size_;
  return true;
}

void KvPool::free(std::span<const int32_t> slots) {
  // First pass: validate and clear the allocated bits, undoing them if a slot
  // is foreign or already free (also a slot repeated within `slots`).
  for (size_t i = 0; i < slots.size(); ++i) {
    const int32_t s = slots[i];
    const bool ok = s >= 0 && s < capacity_ && allocated_[static_cast<size_t>(s)] != 0;
    if (!ok) {
      for (size_t j = 0; j < i; ++j) allocated_[static_cast<size_t>(slots[j])] = 1;
      if (s < 0 || s >= capacity_) fail("KV pool: slot {} is not in the pool of {}", s, capacity_);
      fail("KV pool: double free of slot {}", s);
    }
    allocated_[static_cast<size_t>(s)] = 0;
  }
  for (const int32_t s : slots) {
    const int32_t page = s / page_size_;
    if (--page_in_use_[static_cast<size_t>(page)] == 0) free_pages_.push_back(page);
  }
  free_slots_ += static_cast<int64_t>(slots.size());
}

bool KvPool::is_allocated(int32_t slot) const {
  return slot >= 0 && slot < capacity_ && allocated_[static_cast<size_t>(slot)] != 0;
}

void KvPool::check_invariants() const {
  int64_t free_count = 0;
  std::vector<uint8_t> page_listed(page_in_use_.size(), 0);
  for (const int32_t p : free_pages_) {
    BASALT_ASSERT(p >= 0 && static_cast<size_t>(p) < page_in_use_.size());
    BASALT_ASSERT(page_listed[static_cast<size_t>(p)] == 0);
    page_listed[static_cast<size_t>(p)] = 1;
  }
  for (size_t p = 0; p < page_in_use_.size(); ++p) {
    int32_t used = 0;
    for (int32_t o = 0; o < page_size_; ++o)
      used += allocated_[p * static_cast<size_t>(page_size_) + static_cast<size_t>(o)];
    BASALT_ASSERT(used == page_in_use_[p]);
    BASALT_ASSERT((page_listed[p] != 0) == (used == 0));
    free_count += page_size_ - used;
  }
  BASALT_ASSERT(free_count == free_slots_);
}

}  // namespace basalt

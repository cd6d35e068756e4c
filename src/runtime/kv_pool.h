// KvPool: the fixed set of KV token slots a serving replica owns, and which of
// them are free.
//
// Contract: a pool of `capacity` slots (numbered 0..capacity-1) is created once
// from a memory budget and never grows. The storage the slots index into
// (KvBuffers) is the model's to lay out (Model::allocate_kv, allocated by the
// model runner); the pool never
// looks inside it, it only tracks ownership. Slots are handed out in whole
// pages of `page_size` slots (1 by default); slot = page * page_size + offset,
// so kernels that want pages get them. allocate(n) is all or nothing and
// returns n rounded up to whole pages (the tail of the last page belongs to the
// caller, for the tokens it will decode next). free() returns slots one by one;
// a page goes back to the free list once all of its slots are free. Freeing a
// slot that is not allocated (a double free) or that is not the pool's throws
// basalt::Error and changes nothing: a corrupt free list would silently hand
// one request's KV to another. allocate and free cost O(slots), with no heap
// allocation per slot. Not thread-safe: the scheduler thread owns the pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>


namespace basalt {

class KvPool {
 public:
  // capacity: a positive multiple of page_size; page_size >= 1.
  explicit KvPool(int64_t capacity, int32_t page_size = 1);

  // How many slots fit in budget_bytes at bytes_per_slot each, rounded down to
  // whole pages and capped at the largest slot index an i32 can name.
  static int64_t slots_for_budget(size_t bytes_per_slot, size_t budget_bytes,
                                  int32_t page_size = 1);
  // Physical memory of this host in bytes, and a fraction (0, 1] of it: the
  // budget of the CPU backend.
  static size_t host_memory_bytes();
  static size_t host_memory_budget(double fraction);

  // n > 0 tokens' worth of slots, rounded up to whole pages, or nothing when
  // too few pages are free. Slots of one page are consecutive.
  std::optional<std::vector<int32_t>> allocate(int64_t n);
  // The same, appended to `out` (no allocation beyond its growth); false and
  // nothing appended when too few pages are free.
  bool allocate_into(int64_t n, std::vector<int32_t>& out);
  // Returns slots to the pool; all or nothing (see the contract above).
  void free(std::span<const int32_t> slots);

  bool is_allocated(int32_t slot) const;
  int64_t capacity() const { return capacity_; }
  int32_t page_size() const { return page_size_; }
  // Slots not allocated to anyone (including free slots of a partly used page).
  int64_t free_slots() const { return free_slots_; }
  // Whole pages that allocate() can hand out.
  int64_t free_pages() const { return static_cast<int64_t>(free_pages_.size()); }
  // Slots allocate(n) would return: n rounded up to whole pages.
  int64_t rounded(int64_t n) const;
  // Whether slots, read as the KV of positions 0, 1, 2, ... of one sequence,
  // are page-aligned: the slot of position p is at offset p % page_size of its
  // page, and positions [k * page_size, (k + 1) * page_size) share one page
  // (a trailing partial page is fine). Then page_table[k] = slots[k *
  // page_size] / page_size and slot(p) = page_table[p / page_size] *
  // page_size + p % page_size. Always true for page size 1.
  bool is_page_aligned(std::span<const int32_t> slots) const;

  // Recounts the bookkeeping from scratch; throws basalt::Error on a mismatch.
  void check_invariants() const;

 private:
  int64_t capacity_;
  int32_t page_size_;
  int64_t free_slots_;
  std::vector<int32_t> free_pages_;   // a stack; lowest page on top at the start
  std::vector<uint8_t> allocated_;    // per slot
  std::vector<int32_t> page_in_use_;  // allocated slots per page
};

}  // namespace basalt

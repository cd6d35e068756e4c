// What the in-process rank groups (model/tensor_parallel.h, model/
// data_parallel.h) keep per rank when several ranks serve one caller's
// Model: the caller's KvBuffers hold every rank's layers, rank after rank,
// and ranks other than the one that writes the caller's outputs write
// theirs into scratch tensors of their own.
//
// Contract: concatenated_kv(own, slots) lays the ranks' KvBuffers out one
// after another (rank r's layer l at r * layers + l). RankKvView::of(all,
// r, layers) is rank r's layers of such buffers, kept as one object (the
// same KvBuffers) for as long as they are the same tensors: a rank's
// recorded graphs are bound to the object they recorded on. scratch(backend,
// buffer, shape) is `buffer` seen as an f32 tensor of `shape`, grown
// (reallocated on `backend`) when it holds fewer values.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace basalt {

inline KvBuffers concatenated_kv(const std::vector<KvBuffers>& own, int64_t num_slots) {
  KvBuffers all;
  all.num_slots = num_slots;
  for (const KvBuffers& k : own) {
    all.k.insert(all.k.end(), k.k.begin(), k.k.end());
    all.v.insert(all.v.end(), k.v.begin(), k.v.end());
  }
  return all;
}

class RankKvView {
 public:
  KvBuffers& of(const KvBuffers& all, size_t rank, size_t layers) {
    const auto first = static_cast<std::ptrdiff_t>(rank * layers), n = static_cast<std::ptrdiff_t>(layers);
    const bool same = view_.num_slots == all.num_slots && view_.k.size() == layers && view_.v.size() == layers &&
                      std::equal(view_.k.begin(), view_.k.end(), all.k.begin() + first, same_memory) &&
                      std::equal(view_.v.begin(), view_.v.end(), all.v.begin() + first, same_memory);
    if (!same) {
      view_.num_slots = all.num_slots;
      view_.k.assign(all.k.begin() + first, all.k.begin() + first + n);
      view_.v.assign(all.v.begin() + first, all.v.begin() + first + n);
    }
    return view_;
  }

 private:
  static bool same_memory(const Tensor& a, const Tensor& b) {
    return a.raw() == b.raw() && a.shape() == b.shape() && a.dtype() == b.dtype();
  }
  KvBuffers view_;
};

inline Tensor scratch(Backend& backend, Tensor& buffer, const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (buffer.numel() < n) buffer = backend.empty({n}, DType::kF32);
  return buffer.rows(0, n).reshape(shape);
}

}  // namespace basalt

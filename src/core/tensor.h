// Tensor: a typed, shaped, contiguous view of memory that some owner keeps alive.
//
// Contract: a Tensor is a cheap handle (copying it shares the memory). The
// memory is row-major and contiguous; views (reshape, rows) share the owner.
// Memory comes from Tensor::empty (64-byte aligned host memory), from a
// backend's allocator (device memory), or from Tensor::wrap over memory that an
// owner object keeps alive (for example a memory-mapped checkpoint). Not
// thread-safe for concurrent mutation of the same elements; distinct tensors
// may be used from distinct threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace basalt {

enum class Device : uint8_t { kCpu, kCuda };

using Shape = std::vector<int64_t>;

std::string shape_string(const Shape& shape);  // "[4096, 2048]"
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised host memory, 64-byte aligned.
  static Tensor empty(Shape shape, DType dtype);
  static Tensor zeros(Shape shape, DType dtype);
  // A view of memory that `owner` keeps alive (owner may be null for memory
  // that outlives every use, as in tests).
  static Tensor wrap(void* data, Shape shape, DType dtype, std::shared_ptr<const void> owner,
                     Device device = Device::kCpu);
  // Host tensors from values, for tests and small inputs.
  static Tensor from_f32(Shape shape, std::span<const float> values);
  static Tensor from_i32(Shape shape, std::span<const int32_t> values);

  bool defined() const { return data_ != nullptr || numel() == 0; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  // Size of dimension i; negative i counts from the end.
  int64_t dim(int i) const;
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }

  // Same memory, new shape with the same element count.
  Tensor reshape(Shape shape) const;
  // Rows [begin, begin + count) along dimension 0.
  Tensor rows(int64_t begin, int64_t count) const;
  // A host copy converted to f32 (any floating dtype, or i32/i64 by value).
  Tensor to_f32() const;
  // "bf16[4096, 2048]"
  std::string describe() const;

 private:
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  std::shared_ptr<const void> owner_;
};

}  // namespace basalt

#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace basalt {

std::string shape_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor Tensor::empty(Shape shape, DType dtype) {
  for (int64_t d : shape) BASALT_CHECK(d >= 0, "negative dimension in shape {}", shape_string(shape));
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
  BASALT_CHECK(p || rounded == 0, "out of host memory allocating {} bytes", bytes);
  std::shared_ptr<void> owner(p, [](void* q) { std::free(q); });
  Tensor t;
  t.data_ = p;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.owner_ = std::move(owner);
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  if (t.nbytes()) std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::wrap(void* data, Shape shape, DType dtype, std::shared_ptr<const void> owner,
                    Device device) {
  Tensor t;
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.owner_ = std::move(owner);
  return t;
}

Tensor Tensor::from_f32(Shape shape, std::span<const float> values) {
  BASALT_CHECK(shape_numel(shape) == static_cast<int64_t>(values.size()),
               "from_f32: {} values for shape {}", values.size(), shape_string(shape));
  Tensor t = empty(std::move(shape), DType::kF32);
  if (!values.empty()) std::memcpy(t.data_, values.data(), values.size_bytes());
  return t;
}

Tensor Tensor::from_i32(Shape shape, std::span<const int32_t> values) {
  BASALT_CHECK(shape_numel(shape) == static_cast<int64_t>(values.size()),
               "from_i32: {} values for shape {}", values.size(), shape_string(shape));
  Tensor t = empty(std::move(shape), DType::kI32);
  if (!values.empty()) std::memcpy(t.data_, values.data(), values.size_bytes());
  return t;
}

int64_t Tensor::dim(int i) const {
  const int r = rank();
  if (i < 0) i += r;
  BASALT_CHECK(i >= 0 && i < r, "dimension {} out of range for {}", i, describe());
  return shape_[static_cast<size_t>(i)];
}

Tensor Tensor::reshape(Shape shape) const {
  BASALT_CHECK(shape_numel(shape) == numel(), "cannot reshape {} to {}", describe(),
               shape_string(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t count) const {
  BASALT_CHECK(rank() >= 1 && begin >= 0 && count >= 0 && begin + count <= shape_[0],
               "rows({}, {}) out of range for {}", begin, count, describe());
  Tensor t = *this;
  const int64_t row_elems = shape_[0] ? numel() / shape_[0] : 0;
  t.data_ = static_cast<char*>(data_) + static_cast<size_t>(begin * row_elems) * dtype_size(dtype_);
  t.shape_[0] = count;
  return t;
}

Tensor Tensor::to_f32() const {
  BASALT_CHECK(device_ == Device::kCpu, "to_f32 needs a host tensor, got {}", describe());
  Tensor out = empty(shape_, DType::kF32);
  float* o = out.data<float>();
  const int64_t n = numel();
  switch (dtype_) {
    case DType::kF32: if (n) std::memcpy(o, data_, nbytes()); break;
    case DType::kBF16: for (int64_t i = 0; i < n; ++i) o[i] = bf16_to_f32(data<uint16_t>()[i]); break;
    case DType::kF16: for (int64_t i = 0; i < n; ++i) o[i] = f16_to_f32(data<uint16_t>()[i]); break;
    case DType::kF8E4M3: for (int64_t i = 0; i < n; ++i) o[i] = fp8e4m3_to_f32(data<uint8_t>()[i]); break;
    case DType::kI32: for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(data<int32_t>()[i]); break;
    case DType::kI64: for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(data<int64_t>()[i]); break;
    case DType::kI8: for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(data<int8_t>()[i]); break;
    case DType::kU8: for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(data<uint8_t>()[i]); break;
  }
  return out;
}

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype_)) + shape_string(shape_);
}

}  // namespace basalt

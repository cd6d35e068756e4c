#include "core/tensor.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace basalt {
namespace {

TEST(Tensor, EmptyIsAlignedAndShaped) {
  Tensor t = Tensor::empty({3, 5}, DType::kBF16);
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.nbytes(), 30u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  EXPECT_EQ(t.dim(-1), 5);
  EXPECT_EQ(t.describe(), "bf16[3, 5]");
  EXPECT_THROW(t.dim(2), Error);
  EXPECT_THROW(Tensor::empty({-1}, DType::kF32), Error);
}

TEST(Tensor, ViewsShareMemory) {
  const float values[] = {0, 1, 2, 3, 4, 5};
  Tensor t = Tensor::from_f32({3, 2}, values);
  Tensor r = t.rows(1, 2);
  EXPECT_EQ(r.shape(), (Shape{2, 2}));
  EXPECT_EQ(r.data<float>()[0], 2.0f);
  r.data<float>()[0] = 9.0f;
  EXPECT_EQ(t.data<float>()[2], 9.0f);
  Tensor flat = t.reshape({6});
  EXPECT_EQ(flat.data<float>()[2], 9.0f);
  EXPECT_THROW(t.reshape({5}), Error);
  EXPECT_THROW(t.rows(2, 2), Error);
}

TEST(Tensor, ConvertsToF32) {
  Tensor t = Tensor::empty({2}, DType::kBF16);
  t.data<uint16_t>()[0] = f32_to_bf16(1.5f);
  t.data<uint16_t>()[1] = f32_to_bf16(-3.0f);
  Tensor f = t.to_f32();
  EXPECT_EQ(f.data<float>()[0], 1.5f);
  EXPECT_EQ(f.data<float>()[1], -3.0f);
}

TEST(Tensor, WrapKeepsOwnerAlive) {
  auto owner = std::make_shared<std::vector<float>>(4, 2.0f);
  Tensor t = Tensor::wrap(owner->data(), {4}, DType::kF32, owner);
  std::weak_ptr<std::vector<float>> weak = owner;
  owner.reset();
  EXPECT_FALSE(weak.expired());
  EXPECT_EQ(t.data<float>()[3], 2.0f);
  t = Tensor();
  EXPECT_TRUE(weak.expired());
}

}  // namespace
}  // namespace basalt

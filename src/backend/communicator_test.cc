// The in-process communicator, ranks as threads: every collective against
// what it means computed directly, for 1 to 5 ranks, and a row-parallel
// linear layer (each rank holds a slice of K, partial products summed by
// all_reduce) that gives the whole layer's output, as tensor parallelism
// uses it.
#include "backend/communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/error.h"

namespace basalt {
namespace {

// Runs body(rank, communicator) on one thread per rank and waits.
void on_ranks(int world, const std::function<void(int, Communicator&)>& body) {
  auto group = make_local_group(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { body(r, *group[static_cast<size_t>(r)]); });
  for (auto& t : threads) t.join();
}

float value(int rank, int64_t i) { return static_cast<float>((rank + 1) * 10 + i % 7) - 3.5f; }

class LocalGroup : public ::testing::TestWithParam<int> {};

TEST_P(LocalGroup, AllReduceSumsAndMaxesEveryElement) {
  const int world = GetParam();
  on_ranks(world, [&](int rank, Communicator& c) {
    EXPECT_EQ(c.rank(), rank);
    EXPECT_EQ(c.world_size(), world);
    for (int round = 0; round < 3; ++round) {  // collectives one after another reuse the group
      Tensor x = Tensor::empty({5, 3}, DType::kF32);
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = value(rank, i + round);
      Tensor y = Tensor::empty({5, 3}, DType::kF32);
      std::copy_n(x.data<float>(), x.numel(), y.data<float>());
      c.all_reduce(x, ReduceOp::kSum);
      c.all_reduce(y, ReduceOp::kMax);
      for (int64_t i = 0; i < x.numel(); ++i) {
        float sum = 0, max = value(0, i + round);
        for (int r = 0; r < world; ++r) {
          sum += value(r, i + round);
          max = std::max(max, value(r, i + round));
        }
        EXPECT_EQ(x.data<float>()[i], sum);
        EXPECT_EQ(y.data<float>()[i], max);
      }
    }
    Tensor b = Tensor::empty({4}, DType::kBF16);
    for (int64_t i = 0; i < 4; ++i) b.data<uint16_t>()[i] = f32_to_bf16(value(rank, i));
    c.all_reduce(b);
    for (int64_t i = 0; i < 4; ++i) {
      float sum = 0;
      for (int r = 0; r < world; ++r) sum += bf16_to_f32(f32_to_bf16(value(r, i)));
      EXPECT_EQ(bf16_to_f32(b.data<uint16_t>()[i]), bf16_to_f32(f32_to_bf16(sum)));
    }
  });
}

TEST_P(LocalGroup, AllGatherAndBroadcast) {
  const int world = GetParam();
  on_ranks(world, [&](int rank, Communicator& c) {
    Tensor x = Tensor::empty({2, 3}, DType::kI32);
    for (int64_t i = 0; i < 6; ++i) x.data<int32_t>()[i] = rank * 100 + static_cast<int32_t>(i);
    Tensor out = Tensor::empty({2 * world, 3}, DType::kI32);
    c.all_gather(x, out);
    for (int r = 0; r < world; ++r)
      for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(out.data<int32_t>()[r * 6 + i], r * 100 + i);
    const int root = world - 1;
    Tensor y = Tensor::empty({3}, DType::kF32);
    for (int64_t i = 0; i < 3; ++i) y.data<float>()[i] = value(rank, i);
    c.broadcast(y, root);
    for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(y.data<float>()[i], value(root, i));
  });
}

// Each rank keeps its block of the sum: exactly the all_reduce's bits for
// that block (f32 sums and maxes, bf16 rounded once), over 2 rows per rank.
TEST_P(LocalGroup, ReduceScatterKeepsEachRankItsBlockOfTheAllReduce) {
  const int world = GetParam();
  on_ranks(world, [&](int rank, Communicator& c) {
    for (const DType dtype : {DType::kF32, DType::kBF16})
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        Tensor x = Tensor::empty({2 * world, 3}, dtype);
        for (int64_t i = 0; i < x.numel(); ++i) {
          const float v = value(rank, i) * (i % 2 == 0 ? 1.0f : -0.37f);
          if (dtype == DType::kF32) x.data<float>()[i] = v;
          else x.data<uint16_t>()[i] = f32_to_bf16(v);
        }
        Tensor all = Tensor::empty(x.shape(), dtype);
        std::copy_n(static_cast<const char*>(x.raw()), x.nbytes(), static_cast<char*>(all.raw()));
        c.all_reduce(all, op);
        Tensor mine = Tensor::empty({2, 3}, dtype);
        c.reduce_scatter(x, mine, op);
        EXPECT_EQ(std::memcmp(mine.raw(), static_cast<const char*>(all.raw()) + rank * mine.nbytes(), mine.nbytes()),
                  0)
            << "rank " << rank << " " << dtype_name(dtype) << (op == ReduceOp::kSum ? " sum" : " max");
      }
    // And against the sum written out, f32.
    Tensor x = Tensor::empty({world, 4}, DType::kF32);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = value(rank, i);
    Tensor mine = Tensor::empty({1, 4}, DType::kF32);
    c.reduce_scatter(x, mine);
    for (int64_t i = 0; i < 4; ++i) {
      float sum = 0;
      for (int r = 0; r < world; ++r) sum += value(r, rank * 4 + i);
      EXPECT_EQ(mine.data<float>()[i], sum);
    }
  });
}

// MoE-style dispatch: rank s sends (s + r) % 3 rows to rank r, each row
// tagged with (source, destination, index); everyone checks what arrived.
TEST_P(LocalGroup, AllToAllMovesUnevenBlocksOfRows) {
  const int world = GetParam();
  const auto rows = [](int from, int to) { return static_cast<int64_t>((from + to) % 3); };
  on_ranks(world, [&](int rank, Communicator& c) {
    std::vector<int64_t> send_rows, recv_rows;
    int64_t sending = 0, receiving = 0;
    for (int r = 0; r < world; ++r) {
      send_rows.push_back(rows(rank, r));
      recv_rows.push_back(rows(r, rank));
      sending += send_rows.back();
      receiving += recv_rows.back();
    }
    Tensor send = Tensor::empty({sending, 3}, DType::kI32), recv = Tensor::empty({receiving, 3}, DType::kI32);
    int64_t at = 0;
    for (int r = 0; r < world; ++r)
      for (int64_t i = 0; i < send_rows[static_cast<size_t>(r)]; ++i, ++at) {
        send.data<int32_t>()[at * 3 + 0] = rank;
        send.data<int32_t>()[at * 3 + 1] = r;
        send.data<int32_t>()[at * 3 + 2] = static_cast<int32_t>(i);
      }
    c.all_to_all(send, send_rows, recv, recv_rows);
    at = 0;
    for (int src = 0; src < world; ++src)
      for (int64_t i = 0; i < recv_rows[static_cast<size_t>(src)]; ++i, ++at) {
        EXPECT_EQ(recv.data<int32_t>()[at * 3 + 0], src);
        EXPECT_EQ(recv.data<int32_t>()[at * 3 + 1], rank);
        EXPECT_EQ(recv.data<int32_t>()[at * 3 + 2], i);
      }
  });
}

// Tensor parallelism's row-parallel linear: rank r holds columns
// [r*K/w, (r+1)*K/w) of the weight and of the input; the all-reduced partial
// products are the whole layer's output.
TEST_P(LocalGroup, RowParallelLinearEqualsTheWholeLayer) {
  const int world = GetParam();
  const int64_t T = 3, N = 8, K = 12 * world;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-1, 1);
  Tensor x = Tensor::empty({T, K}, DType::kF32), w = Tensor::empty({N, K}, DType::kF32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = d(rng);
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = d(rng);
  CpuBackend whole_backend;
  Tensor want = Tensor::empty({T, N}, DType::kF32);
  whole_backend.linear(x, w, nullptr, want);
  on_ranks(world, [&](int rank, Communicator& c) {
    CpuBackend backend;
    const int64_t k = K / world, k0 = rank * k;
    Tensor xs = Tensor::empty({T, k}, DType::kF32), ws = Tensor::empty({N, k}, DType::kF32);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) xs.data<float>()[t * k + j] = x.data<float>()[t * K + k0 + j];
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < k; ++j) ws.data<float>()[n * k + j] = w.data<float>()[n * K + k0 + j];
    Tensor partial = Tensor::empty({T, N}, DType::kF32);
    backend.linear(xs, ws, nullptr, partial);
    c.all_reduce(partial);
    for (int64_t i = 0; i < partial.numel(); ++i) EXPECT_NEAR(partial.data<float>()[i], want.data<float>()[i], 1e-4);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, LocalGroup, ::testing::Values(1, 2, 3, 5));

// Ranks that disagree on a collective's size (which NCCL would hang on, or
// corrupt memory with) all throw, naming it, and the group stays usable.
TEST(LocalGroup, RanksDisagreeingOnTheSizeAllThrow) {
  on_ranks(2, [&](int rank, Communicator& c) {
    const int64_t rows = rank + 1;
    Tensor x = Tensor::zeros({2 * rows, 2}, DType::kF32);
    Tensor gathered = Tensor::empty({2 * 2 * rows, 2}, DType::kF32), block = Tensor::empty({rows, 2}, DType::kF32);
    const auto disagree = [](const std::function<void()>& call) {
      try {
        call();
      } catch (const Error& e) {
        return std::string(e.what()).find("disagree") != std::string::npos;
      }
      return false;
    };
    EXPECT_TRUE(disagree([&] { c.all_reduce(x); }));
    EXPECT_TRUE(disagree([&] { c.all_gather(x, gathered); }));
    EXPECT_TRUE(disagree([&] { c.reduce_scatter(x, block); }));
    EXPECT_TRUE(disagree([&] { c.broadcast(x, 0); }));
    Tensor same = Tensor::from_f32({3}, std::vector<float>{1.0f, 1.0f, 1.0f});
    c.all_reduce(same);
    EXPECT_EQ(same.data<float>()[2], 2.0f);
  });
}

TEST(LocalGroup, BadArgumentsThrowBeforeTheCollective) {
  auto group = make_local_group(2);
  Communicator& c = *group[0];
  Tensor i32 = Tensor::empty({4}, DType::kI32);
  EXPECT_THROW(c.all_reduce(i32), Error);
  Tensor x = Tensor::empty({2, 3}, DType::kF32), out = Tensor::empty({3, 3}, DType::kF32);
  EXPECT_THROW(c.all_gather(x, out), Error);
  const std::vector<int64_t> two = {1, 1}, one = {2};
  Tensor recv = Tensor::empty({2, 3}, DType::kF32);
  EXPECT_THROW(c.all_to_all(x, one, recv, two), Error);
  EXPECT_THROW(c.all_to_all(x, std::vector<int64_t>{2, 1}, recv, two), Error);
  EXPECT_THROW(c.broadcast(x, 2), Error);
  Tensor three = Tensor::empty({3, 3}, DType::kF32), one_row = Tensor::empty({1, 3}, DType::kF32);
  EXPECT_THROW(c.reduce_scatter(three, one_row), Error);  // 3 rows do not split over 2 ranks
  EXPECT_THROW(c.reduce_scatter(x, x), Error);            // out must be x's rows / world
  Tensor ints = Tensor::empty({2, 3}, DType::kI32), int_row = Tensor::empty({1, 3}, DType::kI32);
  EXPECT_THROW(c.reduce_scatter(ints, int_row), Error);
  EXPECT_THROW(make_local_group(0), Error);
}

}  // namespace
}  // namespace basalt

// The NCCL communicator on the GPUs this machine has (world 1 on a single
// GPU, every GPU otherwise), one thread per GPU: every collective against
// what it means, read back to the host.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "backend/cuda/nccl_communicator.h"
#include "core/dtype.h"

namespace basalt {
namespace {

int gpus() {
  int n = 0;
  if (!cuda_available() || cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return std::min(n, 8);
}

float value(int rank, int64_t i) { return static_cast<float>((rank + 1) * 10 + i % 7) - 3.5f; }

// One backend and one communicator per rank; body runs on each rank's thread.
void on_gpus(int world, const std::function<void(int, CudaBackend&, Communicator&)>& body) {
  std::vector<std::unique_ptr<CudaBackend>> backends;
  std::vector<CudaBackend*> raw;
  for (int r = 0; r < world; ++r) {
    backends.push_back(std::make_unique<CudaBackend>(r));
    raw.push_back(backends.back().get());
  }
  auto group = make_nccl_group(raw);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      CudaBackend& b = *backends[static_cast<size_t>(r)];
      b.make_current();
      body(r, b, *group[static_cast<size_t>(r)]);
      b.synchronize();
    });
  for (auto& t : threads) t.join();
}

Tensor on_device(CudaBackend& b, const Tensor& host) {
  Tensor t = b.empty(host.shape(), host.dtype());
  b.copy(host, t);
  return t;
}

Tensor on_host(CudaBackend& b, const Tensor& device) {
  Tensor t = Tensor::empty(device.shape(), device.dtype());
  b.copy(device, t);
  return t;
}

TEST(NcclCommunicator, EveryCollectiveOnEveryGpu) {
  const int n = gpus();
  if (n == 0) GTEST_SKIP() << "no CUDA device";
  for (int world : {1, n}) {
    SCOPED_TRACE(testing::Message() << world << " GPUs");
    on_gpus(world, [&](int rank, CudaBackend& b, Communicator& c) {
      EXPECT_EQ(c.rank(), rank);
      EXPECT_EQ(c.world_size(), world);
      // all_reduce, f32 sum and max, bf16 sum.
      Tensor x = Tensor::empty({5, 3}, DType::kF32);
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = value(rank, i);
      Tensor dx = on_device(b, x), dm = on_device(b, x);
      c.all_reduce(dx, ReduceOp::kSum);
      c.all_reduce(dm, ReduceOp::kMax);
      const Tensor sum = on_host(b, dx), max = on_host(b, dm);
      for (int64_t i = 0; i < x.numel(); ++i) {
        float s = 0, m = value(0, i);
        for (int r = 0; r < world; ++r) {
          s += value(r, i);
          m = std::max(m, value(r, i));
        }
        EXPECT_EQ(sum.data<float>()[i], s);
        EXPECT_EQ(max.data<float>()[i], m);
      }
      Tensor h = Tensor::empty({4}, DType::kBF16);
      for (int64_t i = 0; i < 4; ++i) h.data<uint16_t>()[i] = f32_to_bf16(value(rank, i));
      Tensor dh = on_device(b, h);
      c.all_reduce(dh);
      const Tensor hs = on_host(b, dh);
      for (int64_t i = 0; i < 4; ++i) {
        float s = 0;
        for (int r = 0; r < world; ++r) s += bf16_to_f32(f32_to_bf16(value(r, i)));
        EXPECT_NEAR(bf16_to_f32(hs.data<uint16_t>()[i]), s, std::abs(s) * 1e-2);
      }
      // reduce_scatter: rank r keeps rows [2r, 2r + 2) of the sum, f32.
      Tensor rs = Tensor::empty({2 * world, 3}, DType::kF32);
      for (int64_t i = 0; i < rs.numel(); ++i) rs.data<float>()[i] = value(rank, i);
      Tensor drs = on_device(b, rs), dblock = b.empty({2, 3}, DType::kF32);
      c.reduce_scatter(drs, dblock);
      const Tensor block = on_host(b, dblock);
      for (int64_t i = 0; i < 6; ++i) {
        float s = 0;
        for (int r = 0; r < world; ++r) s += value(r, rank * 6 + i);
        EXPECT_EQ(block.data<float>()[i], s);
      }
      // all_gather and broadcast.
      Tensor g = Tensor::empty({2, 3}, DType::kI32);
      for (int64_t i = 0; i < 6; ++i) g.data<int32_t>()[i] = rank * 100 + static_cast<int32_t>(i);
      Tensor dg = on_device(b, g), dout = b.empty({2 * world, 3}, DType::kI32);
      c.all_gather(dg, dout);
      const Tensor out = on_host(b, dout);
      for (int r = 0; r < world; ++r)
        for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(out.data<int32_t>()[r * 6 + i], r * 100 + i);
      Tensor dy = on_device(b, x);
      c.broadcast(dy, world - 1);
      const Tensor y = on_host(b, dy);
      for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(y.data<float>()[i], value(world - 1, i));
      // all_to_all with uneven blocks: rank s sends (s + r) % 3 + 1 rows to rank r.
      std::vector<int64_t> send_rows, recv_rows;
      int64_t sending = 0, receiving = 0;
      for (int r = 0; r < world; ++r) {
        send_rows.push_back((rank + r) % 3 + 1);
        recv_rows.push_back((r + rank) % 3 + 1);
        sending += send_rows.back();
        receiving += recv_rows.back();
      }
      Tensor send = Tensor::empty({sending, 2}, DType::kI32);
      int64_t at = 0;
      for (int r = 0; r < world; ++r)
        for (int64_t i = 0; i < send_rows[static_cast<size_t>(r)]; ++i, ++at) {
          send.data<int32_t>()[at * 2] = rank * 1000 + r;
          send.data<int32_t>()[at * 2 + 1] = static_cast<int32_t>(i);
        }
      Tensor dsend = on_device(b, send), drecv = b.empty({receiving, 2}, DType::kI32);
      c.all_to_all(dsend, send_rows, drecv, recv_rows);
      const Tensor recv = on_host(b, drecv);
      at = 0;
      for (int src = 0; src < world; ++src)
        for (int64_t i = 0; i < recv_rows[static_cast<size_t>(src)]; ++i, ++at) {
          EXPECT_EQ(recv.data<int32_t>()[at * 2], src * 1000 + rank);
          EXPECT_EQ(recv.data<int32_t>()[at * 2 + 1], i);
        }
    });
  }
}

}  // namespace
}  // namespace basalt

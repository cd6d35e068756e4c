// The collectives a DeepSeek-V3 group runs, at its sizes: time per call of
// the NCCL communicator over every visible GPU, and of the in-process CPU
// group at world 2 and 4, for what the cost model in bench/README.md needs.
//
//   basalt_bench_cuda_collectives [--iters N] [--warmup N] [--gpus N]
//
// Shapes, for rows = 1, 8, 32, 128, 512 (a decode batch up to a prefill
// chunk): all_reduce of rows x 7168 (the hidden state after a tensor-parallel
// layer); all_gather of rows x 7168 from each rank; all_to_all of
// rows x 8 x 7168 (each row sent once per routed expert, as a MoE dispatch or
// combine moves it) split evenly over the ranks. bf16 on the GPUs, f32 on the
// CPU group.
//
// NCCL: make_nccl_group over the first --gpus GPUs (default every visible
// one), a CudaBackend and a thread per rank, as model/tensor_parallel.h
// drives them. Each call: the ranks meet at a barrier, then each records an
// event, calls the collective on its backend's stream, records a second
// event and waits for it. "us" is the event-to-event time (what the call
// costs on the stream: launch, synchronisation between ranks and transfer),
// "host us" the wall time from before the first record to the end of the
// wait (adds the host's launch and wake-up). CPU group (make_local_group):
// the same barrier, then the wall time of the call. Each figure is the
// median over --iters calls (default 50, after --warmup 5) of the slowest
// rank's time in that call. Bandwidths as nccl-tests defines them: the
// algorithmic GB/s is the size over the time, where the size is the
// all_reduce buffer, the all_gather output, a rank's all_to_all send buffer;
// the bus GB/s scales it by 2(n-1)/n for all_reduce and (n-1)/n for the
// others, so that it compares with a link's speed (0 at world 1, where
// nothing crosses a link). NCCL_NVLS_ENABLE=0 unless the environment says
// otherwise (nccl_communicator.h). Without NCCL in the build, or without a
// GPU, only the CPU group runs.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend/communicator.h"
#include "bench_util.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device.h"
#include "core/dtype.h"
#include "core/tensor.h"
#ifdef BASALT_HAVE_NCCL
#include "backend/cuda/nccl_communicator.h"
#endif

using namespace basalt;

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kHidden = 7168;
constexpr int64_t kTopK = 8;
constexpr int64_t kRows[] = {1, 8, 32, 128, 512};

struct Options {
  int iters = 50;
  int warmup = 5;
  int gpus = 0;  // 0: every visible GPU
};

bool parse(int argc, char** argv, Options* o) {
  return bench::parse_int_flags(argc, argv,
                                {{"--iters", &o->iters, 1}, {"--warmup", &o->warmup, 0}, {"--gpus", &o->gpus, 1}});
}

enum class Op { kAllReduce, kAllGather, kAllToAll };
constexpr Op kOps[] = {Op::kAllReduce, Op::kAllGather, Op::kAllToAll};

const char* op_name(Op op) {
  return op == Op::kAllReduce ? "all_reduce" : op == Op::kAllGather ? "all_gather" : "all_to_all";
}

// One rank's tensors for one op and size.
struct Buffers {
  Tensor in, out;
  std::vector<int64_t> send_rows, recv_rows;
};

// alloc returns a zeroed tensor where the rank's collectives take them.
Buffers make_buffers(Op op, int64_t rows, int rank, int world, DType dtype,
                     const std::function<Tensor(Shape, DType)>& alloc) {
  Buffers b;
  if (op == Op::kAllReduce) {
    b.in = alloc({rows, kHidden}, dtype);
  } else if (op == Op::kAllGather) {
    b.in = alloc({rows, kHidden}, dtype);
    b.out = alloc({rows * world, kHidden}, dtype);
  } else {
    // Every rank splits its rows * 8 the same way, so rank r receives
    // split[r] rows from each rank.
    const int64_t total = rows * kTopK;
    for (int r = 0; r < world; ++r) b.send_rows.push_back(total / world + (r < total % world ? 1 : 0));
    b.recv_rows.assign(static_cast<size_t>(world), b.send_rows[static_cast<size_t>(rank)]);
    b.in = alloc({total, kHidden}, dtype);
    b.out = alloc({b.send_rows[static_cast<size_t>(rank)] * world, kHidden}, dtype);
  }
  return b;
}

void call(Communicator& c, Op op, Buffers& b) {
  if (op == Op::kAllReduce) c.all_reduce(b.in);
  else if (op == Op::kAllGather) c.all_gather(b.in, b.out);
  else c.all_to_all(b.in, b.send_rows, b.out, b.recv_rows);
}

// The size nccl-tests divides by the time, in bytes.
double size_bytes(Op op, int64_t rows, int world, DType dtype) {
  const double row = static_cast<double>(kHidden * dtype_size(dtype));
  if (op == Op::kAllReduce) return static_cast<double>(rows) * row;
  if (op == Op::kAllGather) return static_cast<double>(rows * world) * row;
  return static_cast<double>(rows * kTopK) * row;
}

double bus_factor(Op op, int world) {
  const double n = world;
  return op == Op::kAllReduce ? 2 * (n - 1) / n : (n - 1) / n;
}

struct Sample {
  double us = 0;       // on the stream (GPU) or wall (CPU)
  double host_us = 0;  // wall, launch to completion
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Runs rank_body(rank, barrier, samples) on a thread per rank and returns
// the medians over calls of the slowest rank's times in each call.
Sample lockstep(int world, const std::function<void(int, std::barrier<>&, std::vector<Sample>&)>& rank_body) {
  std::barrier<> sync(world);
  std::vector<std::vector<Sample>> samples(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] { rank_body(r, sync, samples[static_cast<size_t>(r)]); });
  for (auto& t : threads) t.join();
  std::vector<double> us, host_us;
  for (size_t i = 0; i < samples[0].size(); ++i) {
    Sample slowest;
    for (const auto& rank : samples) {
      slowest.us = std::max(slowest.us, rank[i].us);
      slowest.host_us = std::max(slowest.host_us, rank[i].host_us);
    }
    us.push_back(slowest.us);
    host_us.push_back(slowest.host_us);
  }
  return {median(us), median(host_us)};
}

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

void print_header() {
  std::printf("%-10s %5s %5s %10s %10s %10s %10s %10s\n", "op", "world", "rows", "MB", "us", "host us", "alg GB/s",
              "bus GB/s");
}

void print_row(Op op, int world, int64_t rows, DType dtype, const Sample& s) {
  const double bytes = size_bytes(op, rows, world, dtype);
  const double alg = bytes / (s.us * 1e-6) / 1e9;
  std::printf("%-10s %5d %5lld %10.3f %10.1f %10.1f %10.2f %10.2f\n", op_name(op), world,
              static_cast<long long>(rows), bytes / 1e6, s.us, s.host_us, alg, alg * bus_factor(op, world));
}

#ifdef BASALT_HAVE_NCCL
void bench_nccl(const Options& o) {
  const int visible = cuda_device_count();
  const int world = o.gpus > 0 ? std::min(o.gpus, visible) : visible;
  cudaDeviceProp prop{};
  BASALT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::vector<std::unique_ptr<CudaBackend>> backends;
  std::vector<CudaBackend*> raw;
  for (int r = 0; r < world; ++r) {
    backends.push_back(std::make_unique<CudaBackend>(r));
    raw.push_back(backends.back().get());
  }
  auto group = make_nccl_group(raw);
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  std::printf("NCCL, %d GPU(s) (%s), bf16, NCCL_NVLS_ENABLE=%s; medians of %d calls after %d warm-ups\n", world,
              prop.name, nvls ? nvls : "unset", o.iters, o.warmup);
  print_header();
  for (Op op : kOps)
    for (int64_t rows : kRows) {
      const Sample s = lockstep(world, [&](int r, std::barrier<>& sync, std::vector<Sample>& out) {
        CudaBackend& b = *backends[static_cast<size_t>(r)];
        b.make_current();
        Buffers t = make_buffers(op, rows, r, world, DType::kBF16, [&](Shape shape, DType dtype) {
          Tensor x = b.empty(std::move(shape), dtype);
          cuda_fill_bytes(x, 0);
          return x;
        });
        cuda_synchronize();
        cudaEvent_t start, stop;
        BASALT_CUDA_CHECK(cudaEventCreate(&start));
        BASALT_CUDA_CHECK(cudaEventCreate(&stop));
        for (int i = 0; i < o.warmup + o.iters; ++i) {
          sync.arrive_and_wait();
          const auto t0 = Clock::now();
          BASALT_CUDA_CHECK(cudaEventRecord(start, b.stream()));
          call(*group[static_cast<size_t>(r)], op, t);
          BASALT_CUDA_CHECK(cudaEventRecord(stop, b.stream()));
          BASALT_CUDA_CHECK(cudaEventSynchronize(stop));
          const double host_us = us_since(t0);
          float ms = 0;
          BASALT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
          if (i >= o.warmup) out.push_back({ms * 1e3, host_us});
        }
        BASALT_CUDA_CHECK(cudaEventDestroy(start));
        BASALT_CUDA_CHECK(cudaEventDestroy(stop));
      });
      print_row(op, world, rows, DType::kBF16, s);
    }
}
#endif

void bench_local(const Options& o, int world) {
  auto group = make_local_group(world);
  std::printf("\nin-process CPU group, world %d, f32; medians of %d calls after %d warm-ups (us = host us: wall)\n",
              world, o.iters, o.warmup);
  print_header();
  for (Op op : kOps)
    for (int64_t rows : kRows) {
      const Sample s = lockstep(world, [&](int r, std::barrier<>& sync, std::vector<Sample>& out) {
        Buffers t = make_buffers(op, rows, r, world, DType::kF32, [](Shape shape, DType dtype) {
          Tensor x = Tensor::empty(std::move(shape), dtype);
          std::memset(x.raw(), 0, x.nbytes());
          return x;
        });
        for (int i = 0; i < o.warmup + o.iters; ++i) {
          sync.arrive_and_wait();
          const auto t0 = Clock::now();
          call(*group[static_cast<size_t>(r)], op, t);
          const double us = us_since(t0);
          if (i >= o.warmup) out.push_back({us, us});
        }
      });
      print_row(op, world, rows, DType::kF32, s);
    }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, &o)) return 2;
#ifdef BASALT_HAVE_NCCL
  if (cuda_available()) bench_nccl(o);
  else std::printf("no CUDA device: NCCL not timed\n");
#else
  std::printf("built without NCCL: NCCL not timed\n");
#endif
  for (int world : {2, 4}) bench_local(o, world);
  return 0;
}

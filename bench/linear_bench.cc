// Speed of CpuBackend::linear (bf16, f16, f32 weights) and linear_int (int8 and
// int4 codes with f16 scales per 32 columns, core/int_weights.h) at decode
// (1 token) and prefill (64 tokens)
// batch sizes on Llama-3.2-1B's projection shapes, next to the two ceilings
// that matter: the machine's memory read bandwidth (decode streams every
// weight once per token; measured per row as the time to stream the same
// number of bytes, in turns with the op, because a virtual machine's share
// of bandwidth drifts with its neighbours) and OpenBLAS sgemm on f32 copies
// of the weights (prefill is compute bound).
//
//   basalt_bench_linear [--quick] [--only bf16|f16|f32|int8|int4]
//
// bf16 weights meet the backend's default activations (rounded to bf16);
// f16 and f32 weights meet f32 activations (the kernel `--dtype float32`
// gives bf16 weights too).
//
// Weights are cold for every call, as they are in a real forward pass where
// the other layers' weights evict them: each repetition uses the next of
// several copies that together exceed the last-level cache. Times are
// medians over repetitions, ours and sgemm taking turns. Threads: the backend's global pool
// (BASALT_NUM_THREADS to override), and OpenBLAS is given the same count.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/int_linear.h"
#include "backend/cpu/simd.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

#if defined(BASALT_BENCH_OPENBLAS)
#include <cblas.h>
#endif

namespace basalt {
namespace {

using Clock = std::chrono::steady_clock;

// Working sets this large are far beyond any last-level cache we target
// (32 MiB on the EPYC VM, a few hundred MiB on the largest server parts).
constexpr size_t kColdBytes = size_t{1} << 30;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Median seconds of each fns[i](rep). The functions run in turns (a block
// of repetitions of each, three rounds), so a slow drift in what else the
// machine is doing hits all of them alike; blocks rather than single calls,
// with a pause after each, because a library's worker threads keep spinning
// for a while after a call (OpenBLAS's for tens of milliseconds) and would
// steal the cores from whatever runs next.
std::vector<double> median_seconds(const std::vector<std::function<void(int)>>& fns,
                                   double min_seconds, int min_reps) {
  constexpr int kRounds = 3;
  const double block_seconds = min_seconds / (kRounds * static_cast<double>(fns.size()));
  const int block_reps = (min_reps + kRounds - 1) / kRounds;
  std::vector<std::vector<double>> times(fns.size());
  int rep = 0;
  for (int round = 0; round < kRounds; ++round) {
    for (size_t i = 0; i < fns.size(); ++i) {
      fns[i](rep++);  // warm-up: page faults, thread wake-up, lazy init
      const auto start = Clock::now();
      for (int n = 0; n < block_reps || (seconds_since(start) < block_seconds && n < 1000); ++n) {
        const auto t0 = Clock::now();
        fns[i](rep++);
        times[i].push_back(seconds_since(t0));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  std::vector<double> medians;
  for (auto& t : times) {
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    medians.push_back(t[t.size() / 2]);
  }
  return medians;
}

// The other processes competing for the cores: medians on a shared machine
// are only as good as this is low.
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one.empty() ? "unknown" : one + " " + five + " " + fifteen;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

// A 1 GiB buffer and a multi-threaded streaming read (sum) of any part of
// it: the decode ceiling. Prefetching as the decode kernel does, so the
// ceiling is what a well-written stream reaches, not what the hardware
// prefetcher alone reaches (it stops at every 4 KiB page).
class ReadProbe {
 public:
  explicit ReadProbe(ThreadPool& pool)
      : pool_(pool),
        buffer_(Tensor::empty({static_cast<int64_t>(kBytes / sizeof(float))}, DType::kF32)),
        sink_(static_cast<size_t>(pool.size()) * 16) {
    float* data = buffer_.data<float>();
    pool.parallel_for(buffer_.numel(), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) data[i] = static_cast<float>(i & 7);
    });
  }

  // Reads `bytes` starting at a place that depends on rep, so consecutive
  // reads of a small size do not hit the cache. Threads claim 256 KiB chunks
  // dynamically, as the linear kernel claims its rows, so that neither side
  // is favoured by how a shared machine schedules threads.
  void read(size_t bytes, int rep) {
    const int64_t floats = static_cast<int64_t>(std::min(bytes, kBytes) / sizeof(float));
    const int64_t slots = static_cast<int64_t>(kBytes / sizeof(float)) / floats;
    const float* base = buffer_.data<float>() + (rep % slots) * floats;
    constexpr int64_t kChunk = (256 << 10) / sizeof(float);
    std::atomic<int64_t> next{0};
    pool_.parallel_for(pool_.size(), [&](int64_t t0, int64_t) {
      using cpu::Vec;
      Vec a0 = cpu::vzero(), a1 = cpu::vzero(), a2 = cpu::vzero(), a3 = cpu::vzero();
      for (int64_t c = next.fetch_add(kChunk); c < floats; c = next.fetch_add(kChunk)) {
        const float* p = base + c;
        const int64_t n = std::min(kChunk, floats - c);
        for (int64_t i = 0; i + 4 * cpu::kLanes <= n; i += 4 * cpu::kLanes) {
          __builtin_prefetch(p + i + 256);
          a0 = cpu::vadd(a0, cpu::vload(p + i));
          a1 = cpu::vadd(a1, cpu::vload(p + i + cpu::kLanes));
          a2 = cpu::vadd(a2, cpu::vload(p + i + 2 * cpu::kLanes));
          a3 = cpu::vadd(a3, cpu::vload(p + i + 3 * cpu::kLanes));
        }
      }
      sink_[t0 * 16] = cpu::vsum(cpu::vadd(cpu::vadd(a0, a1), cpu::vadd(a2, a3)));
    });
  }

  // GB/s of reading the whole buffer.
  double bandwidth() {
    const double seconds = median_seconds({[&](int rep) { read(kBytes, rep); }}, 1.0, 5)[0];
    float keep = 0.0f;
    for (float v : sink_) keep += v;
    if (keep == -1.0f) fmt::print("{}", keep);  // keeps the sums observable
    return static_cast<double>(kBytes) / seconds / 1e9;
  }

 private:
  static constexpr size_t kBytes = size_t{1} << 30;
  ThreadPool& pool_;
  Tensor buffer_;
  std::vector<float> sink_;
};

struct Shape3 {
  const char* what;
  int64_t in, outs;
};

struct Row {
  std::string shape;
  int64_t tokens;
  std::string dtype;
  double ours_s, ours_gbs, ours_gflops;
  double read_s = 0.0;  // streaming the same number of bytes, measured alongside
  double blas_s = 0.0, blas_gflops = 0.0;
};

// Enough distinct copies of an integer-format weight (codes and scales) to
// make every call cold.
std::vector<LinearWeight> int_weight_copies(const Tensor& w32, int bits) {
  const IntWeightLayout l{bits, 32, w32.dim(1)};
  const int64_t rows = w32.dim(0);
  LinearWeight q;
  q.int_layout = l;
  q.weight = Tensor::empty({rows, l.code_columns()}, bits == 8 ? DType::kI8 : DType::kU8);
  q.scales = Tensor::empty({rows, l.scale_columns()}, DType::kF16);
  for (int64_t r = 0; r < rows; ++r)
    quantize_int_row(l, w32.data<const float>() + r * l.in_features, q.weight.data<uint8_t>() + r * l.code_columns(),
                     q.scales.data<uint16_t>() + r * l.scale_columns());
  const size_t bytes = q.weight.nbytes() + q.scales.nbytes();
  std::vector<LinearWeight> out;
  for (size_t i = 0; i < std::max<size_t>(2, (kColdBytes + bytes - 1) / bytes); ++i) {
    LinearWeight c = q;
    c.weight = Tensor::empty(q.weight.shape(), q.weight.dtype());
    c.scales = Tensor::empty(q.scales.shape(), q.scales.dtype());
    std::memcpy(c.weight.raw(), q.weight.raw(), q.weight.nbytes());
    std::memcpy(c.scales.raw(), q.scales.raw(), q.scales.nbytes());
    out.push_back(c);
  }
  return out;
}

// Enough distinct copies of a weight matrix to make every call cold.
std::vector<Tensor> weight_copies(const Tensor& w) {
  const size_t copies = std::max<size_t>(2, (kColdBytes + w.nbytes() - 1) / w.nbytes());
  std::vector<Tensor> out;
  for (size_t i = 0; i < copies; ++i) {
    Tensor c = Tensor::empty(w.shape(), w.dtype());
    std::memcpy(c.raw(), w.raw(), w.nbytes());
    out.push_back(c);
  }
  return out;
}

void print_table(const std::vector<Row>& rows) {
  fmt::print("\n{:<24} {:>3} {:>7} | {:>8} {:>6} {:>7} {:>6} | {:>8} {:>7} {:>8}\n", "shape (K -> N)",
             "T", "w", "ours ms", "GB/s", "GFLOP/s", "of BW", "sgemm ms", "GFLOP/s", "vs sgemm");
  fmt::print("{}\n", std::string(100, '-'));
  for (const Row& r : rows) {
    std::string blas = "       -       -        -";
    if (r.blas_s > 0.0) {
      blas = fmt::format("{:>8.3f} {:>7.1f} {:>7.2f}x", r.blas_s * 1e3, r.blas_gflops,
                         r.blas_s / r.ours_s);
    }
    fmt::print("{:<24} {:>3} {:>7} | {:>8.3f} {:>6.1f} {:>7.1f} {:>5.0f}% | {}\n", r.shape, r.tokens,
               r.dtype, r.ours_s * 1e3, r.ours_gbs, r.ours_gflops, 100.0 * r.read_s / r.ours_s,
               blas);
  }
  fmt::print(
      "\nGB/s counts weight bytes read (int8/int4: codes and f16 scales per 32 columns).\n"
      "int8amx / int8vec: the same call with Intel's AMX kernel and with the vector kernel.\n"
      "int8il / int8rows: the same call with the rows interleaved (what loading does here) and\n"
      "row by row.\n"
      "'of BW' is the time to merely stream the same number\n"
      "of bytes (all threads, measured in turns with the op) over the op's time: the share of\n"
      "the decode ceiling reached. 'vs sgemm' is OpenBLAS time / our time on the same shape\n"
      "(>1: ours is faster); sgemm always runs on f32 weights.\n");
}

int run(bool quick, const std::string& only) {
  ThreadPool& pool = ThreadPool::global();
  CpuBackend backend(&pool);
#if defined(BASALT_BENCH_OPENBLAS)
  openblas_set_num_threads(pool.size());
#endif
  fmt::print("basalt_bench_linear: {}, {} threads, {}-lane f32 vectors, load average {}\n",
             cpu_model(), pool.size(), cpu::kLanes, load_average());
  ReadProbe probe(pool);
  fmt::print("memory read bandwidth (1 GiB streaming sum, all threads): {:.1f} GB/s\n",
             probe.bandwidth());

  const std::vector<Shape3> shapes = {{"2048 -> 8192 (gate_up)", 2048, 8192},
                                      {"2048 -> 2048 (q, o)", 2048, 2048},
                                      {"8192 -> 2048 (down)", 8192, 2048},
                                      {"2048 -> 128256 (lm_head)", 2048, 128256}};
  const double min_seconds = quick ? 0.2 : 1.0;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<Row> rows;
  for (const Shape3& s : shapes) {
    Tensor w32 = Tensor::empty({s.outs, s.in}, DType::kF32);
    for (int64_t i = 0; i < w32.numel(); ++i) w32.data<float>()[i] = normal(rng);
    Tensor w16 = Tensor::empty({s.outs, s.in}, DType::kBF16);
    backend.copy(w32, w16);
    Tensor wf16 = Tensor::empty({s.outs, s.in}, DType::kF16);
    backend.copy(w32, wf16);
    for (const std::string format : {"bf16", "f16", "f32", "int8", "int4"}) {
      if (!only.empty() && format != only) continue;
      const bool ints = format.starts_with("int");
      const Tensor& w = format == "bf16" ? w16 : format == "f16" ? wf16 : w32;
      const std::vector<Tensor> weights = ints ? std::vector<Tensor>{} : weight_copies(w);
      // The integer weights as a model load leaves them (prepared by the
      // backend: rows interleaved where that pays here), and row by row.
      const std::vector<LinearWeight> row_weights = ints ? int_weight_copies(w32, format == "int8" ? 8 : 4)
                                                         : std::vector<LinearWeight>{};
      std::vector<LinearWeight> int_weights = row_weights;
      for (LinearWeight& c : int_weights) backend.prepare_int_weight(c);
      const bool rows_row = ints && int_weights[0].int_layout.rows_interleaved;
      const size_t bytes = ints ? int_weights[0].weight.nbytes() + int_weights[0].scales.nbytes() : weights[0].nbytes();
      for (int64_t tokens : {int64_t{1}, int64_t{64}}) {
        Tensor x = Tensor::empty({tokens, s.in}, DType::kF32);
        for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = normal(rng) * 50.0f;
        Tensor out = Tensor::empty({tokens, s.outs}, DType::kF32);
        std::vector<std::function<void(int)>> fns;
        // Prefill-sized int calls take the AMX kernel where there is one;
        // the vector kernel's time is measured next to it.
        const bool amx_row = ints && tokens > 4 && cpu::linear_int_amx_available();
        if (ints) {
          fns.push_back([&](int rep) { backend.linear_int(x, int_weights[rep % int_weights.size()], nullptr, out); });
          if (rows_row)
            fns.push_back([&](int rep) { backend.linear_int(x, row_weights[rep % row_weights.size()], nullptr, out); });
          if (amx_row)
            fns.push_back([&](int rep) {
              cpu::linear_int_allow_amx(false);
              backend.linear_int(x, int_weights[rep % int_weights.size()], nullptr, out);
              cpu::linear_int_allow_amx(true);
            });
        } else {
          fns.push_back([&](int rep) { backend.linear(x, weights[rep % weights.size()], nullptr, out); });
        }
#if defined(BASALT_BENCH_OPENBLAS)
        // sgemm on f32 weights: next to f32 at both batch sizes, and next to
        // bf16 at 64 tokens, where both are compute bound.
        std::vector<Tensor> f32_copies;
        Tensor blas_out = Tensor::empty({tokens, s.outs}, DType::kF32);
        if ((format == "f32") || tokens == 64) {
          f32_copies = format == "f32" ? weights : weight_copies(w32);
          fns.push_back([&](int rep) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(tokens),
                        static_cast<int>(s.outs), static_cast<int>(s.in), 1.0f, x.data<float>(),
                        static_cast<int>(s.in),
                        // Half a rotation away from ours: never the copy ours just warmed.
                        f32_copies[(rep + f32_copies.size() / 2) % f32_copies.size()].data<float>(),
                        static_cast<int>(s.in), 0.0f, blas_out.data<float>(),
                        static_cast<int>(s.outs));
          });
        }
#endif
        fns.push_back([&](int rep) { probe.read(bytes, rep); });
        const std::vector<double> seconds = median_seconds(fns, min_seconds, 5);
        const double flops = 2.0 * tokens * s.in * s.outs;
        const auto make_row = [&](const std::string& label, double s_ours) {
          Row row{s.what, tokens, label, s_ours, static_cast<double>(bytes) / s_ours / 1e9, flops / s_ours / 1e9};
          row.read_s = seconds.back();
          const size_t blas_at = 1 + (amx_row ? 1 : 0) + (rows_row ? 1 : 0);
          if (seconds.size() > blas_at + 1) {
            row.blas_s = seconds[blas_at];
            row.blas_gflops = flops / row.blas_s / 1e9;
          }
          return row;
        };
        rows.push_back(make_row(amx_row ? format + "amx" : rows_row ? format + "il" : format, seconds[0]));
        if (rows_row) rows.push_back(make_row(format + "rows", seconds[1]));
        if (amx_row) rows.push_back(make_row(format + "vec", seconds[1]));
        fmt::print(stderr, "  measured {} T={} {}\n", s.what, tokens, format);
      }
    }
  }
  print_table(rows);
  fmt::print("load average at the end: {}\n", load_average());
  return 0;
}

}  // namespace
}  // namespace basalt

int main(int argc, char** argv) {
  bool quick = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else {
      fmt::print(stderr, "usage: basalt_bench_linear [--quick] [--only bf16|f16|f32|int8|int4]\n");
      return 2;
    }
  }
  return basalt::run(quick, only);
}

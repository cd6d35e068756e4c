// The peer of basalt_bench_linear: ggml's CPU matrix product (the kernels
// llama.cpp runs) on bf16, f16 and its quantized types at the same shapes,
// with the same method, so the two tables compare line for line.
//
// Built by hand against a ggml source checkout (not part of Basalt; see
// bench/README.md "Integer weights against ggml"):
//
//   cmake -S $GGML -B $GGML/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON && ninja -C $GGML/build
//   g++ -O2 -std=c++20 -I$GGML/include bench/peers/ggml_linear.cc -o build/ggml_linear_peer \
//       -L$GGML/build/src -lggml -lggml-base -lggml-cpu -Wl,-rpath,$GGML/build/src
//   build/ggml_linear_peer [--quick]
//
// Method, as basalt_bench_linear's: the weights are random normal (sigma
// 0.02) quantized by ggml_quantize_chunk, in enough copies that together
// exceed 1 GiB (every call reads cold weights, as a forward pass does); the
// activations f32 [T, K] (ggml quantizes them to its dot type inside, as
// Basalt quantizes them per 32 columns). All copies' products are one graph,
// as a forward pass is one graph in llama.cpp: ggml's threads wait between
// graphs by sleeping, which a graph per product would time. The graph runs
// on a persistent threadpool of BASALT_NUM_THREADS threads (default: the
// hardware's); a product's time is the graph's over the number of copies,
// the median over graphs in three rounds. GB/s counts the weight bytes
// (codes and scales) per product.
#include <ggml-cpu.h>
#include <ggml.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  const char* what;
  int64_t in, outs;
};

struct Type {
  const char* name;
  ggml_type type;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int threads() {
  if (const char* env = std::getenv("BASALT_NUM_THREADS")) return std::max(1, std::atoi(env));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// One weight type at one shape and token count: one graph of `copies`
// products out_i = w_i · x.
class Case {
 public:
  Case(const Shape& s, ggml_type type, int64_t tokens, const std::vector<float>& w32, ggml_threadpool* pool,
       int n_threads)
      : pool_(pool), n_threads_(n_threads) {
    const size_t row_bytes = ggml_row_size(type, s.in);
    weight_bytes_ = row_bytes * static_cast<size_t>(s.outs);
    const size_t copies = std::max<size_t>(2, ((size_t{1} << 30) + weight_bytes_ - 1) / weight_bytes_);
    const size_t out_bytes = static_cast<size_t>(s.outs * tokens) * sizeof(float);
    const size_t x_bytes = static_cast<size_t>(s.in * tokens) * sizeof(float);
    ggml_init_params params{};
    params.mem_size = copies * (weight_bytes_ + out_bytes + 4 * ggml_tensor_overhead() + ggml_graph_overhead()) +
                      x_bytes + (size_t{16} << 20);
    params.no_alloc = false;
    ctx_ = ggml_init(params);
    x_ = ggml_new_tensor_2d(ctx_, GGML_TYPE_F32, s.in, tokens);
    std::mt19937 rng(2);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < s.in * tokens; ++i) static_cast<float*>(x_->data)[i] = normal(rng);
    std::vector<uint8_t> quantized(weight_bytes_);
    ggml_quantize_chunk(type, w32.data(), quantized.data(), 0, s.outs, s.in, nullptr);
    graph_ = ggml_new_graph_custom(ctx_, static_cast<size_t>(4 * copies + 16), false);
    for (size_t c = 0; c < copies; ++c) {
      ggml_tensor* w = ggml_new_tensor_2d(ctx_, type, s.in, s.outs);
      std::memcpy(w->data, quantized.data(), weight_bytes_);
      ggml_build_forward_expand(graph_, ggml_mul_mat(ctx_, w, x_));
    }
    copies_ = copies;
    work_.resize(ggml_graph_plan(graph_, n_threads_, pool_).work_size + 1);
  }
  ~Case() { ggml_free(ctx_); }
  Case(const Case&) = delete;
  Case& operator=(const Case&) = delete;

  // Runs the graph; seconds per product.
  double run() {
    ggml_cplan plan = ggml_graph_plan(graph_, n_threads_, pool_);
    plan.work_data = work_.data();
    const auto start = Clock::now();
    ggml_graph_compute(graph_, &plan);
    return seconds_since(start) / static_cast<double>(copies_);
  }
  size_t weight_bytes() const { return weight_bytes_; }

 private:
  ggml_threadpool* pool_;
  int n_threads_;
  ggml_context* ctx_ = nullptr;
  ggml_tensor* x_ = nullptr;
  ggml_cgraph* graph_ = nullptr;
  size_t copies_ = 0;
  std::vector<uint8_t> work_;
  size_t weight_bytes_ = 0;
};

// Median seconds per product over graphs in three rounds, after a warm-up graph per round.
double median_seconds(Case& c, double min_seconds) {
  std::vector<double> times;
  for (int round = 0; round < 3; ++round) {
    c.run();
    const auto start = Clock::now();
    for (int n = 0; n < 2 || (seconds_since(start) < min_seconds / 3 && n < 1000); ++n) times.push_back(c.run());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::nth_element(times.begin(), times.begin() + static_cast<long>(times.size() / 2), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int n_threads = threads();
  ggml_cpu_init();
  ggml_threadpool_params tp = ggml_threadpool_params_default(n_threads);
  ggml_threadpool* pool = ggml_threadpool_new(&tp);
  std::printf("ggml_linear_peer: ggml CPU mul_mat, %d threads\n", n_threads);
  const std::vector<Shape> shapes = {{"2048 -> 8192 (gate_up)", 2048, 8192},
                                     {"2048 -> 2048 (q, o)", 2048, 2048},
                                     {"8192 -> 2048 (down)", 8192, 2048}};
  const std::vector<Type> types = {{"bf16", GGML_TYPE_BF16}, {"f16", GGML_TYPE_F16}, {"q8_0", GGML_TYPE_Q8_0},
                                   {"q4_0", GGML_TYPE_Q4_0}, {"q4_K", GGML_TYPE_Q4_K}};
  std::printf("\n%-22s %3s %5s | %8s %6s %7s\n", "shape (K -> N)", "T", "w", "ms", "GB/s", "GFLOP/s");
  std::printf("%s\n", std::string(60, '-').c_str());
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (const Shape& s : shapes) {
    std::vector<float> w32(static_cast<size_t>(s.in * s.outs));
    for (float& v : w32) v = normal(rng);
    for (const Type& t : types) {
      for (int64_t tokens : {int64_t{1}, int64_t{64}}) {
        Case c(s, t.type, tokens, w32, pool, n_threads);
        const double sec = median_seconds(c, quick ? 0.2 : 1.0);
        std::printf("%-22s %3lld %5s | %8.3f %6.1f %7.1f\n", s.what, static_cast<long long>(tokens), t.name,
                    sec * 1e3, static_cast<double>(c.weight_bytes()) / sec / 1e9,
                    2.0 * static_cast<double>(tokens * s.in * s.outs) / sec / 1e9);
        std::fflush(stdout);
      }
    }
  }
  ggml_threadpool_free(pool);
  return 0;
}

// Helpers shared by the whole-model benchmarks: cheap random weights, a
// memory-bandwidth probe and a timed generation that splits prefill from
// decode by token timestamps.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "runtime/generator.h"

namespace basalt::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// xorshift64: fast enough to fill the billions of weights of a full model.
struct Rng {
  uint64_t x;
  explicit Rng(uint64_t seed) : x(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  }
  // Uniform in [-1, 1).
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; }
};

// Uniform values in [-scale, scale).
inline Tensor random_bf16(Shape shape, float scale, uint64_t seed) {
  Tensor t = Tensor::empty(std::move(shape), DType::kBF16);
  Rng rng(seed);
  uint16_t* p = t.data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = f32_to_bf16(rng.uniform() * scale);
  return t;
}

// GB/s of a multi-threaded streaming read over a buffer far larger than the
// caches: the ceiling for decode, which reads every weight once per token.
inline double measure_read_bandwidth() {
  const size_t n = size_t{1} << 27;  // 512 MiB of floats
  std::vector<float> buffer(n, 1.0f);
  ThreadPool& pool = ThreadPool::global();
  std::vector<double> sink(static_cast<size_t>(pool.size()), 0.0);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = Clock::now();
    pool.parallel_for(static_cast<int64_t>(n), [&](int64_t b, int64_t e) {
      float acc[16] = {};
      for (int64_t i = b; i + 16 <= e; i += 16)
        for (int j = 0; j < 16; ++j) acc[j] += buffer[static_cast<size_t>(i + j)];
      double s = 0;
      for (float a : acc) s += a;
      sink[static_cast<size_t>(b * static_cast<int64_t>(sink.size()) / static_cast<int64_t>(n))] += s;
    });
    best = std::max(best, static_cast<double>(n * sizeof(float)) / seconds_since(start) / 1e9);
  }
  return best;
}

// Walks a bench's `--flag [value]` arguments: --help or -h prints `usage`
// and exits 0; a flag listed in `switches` takes no value and goes to
// on_switch(flag); any other needs one and goes to on_value(flag, value),
// which returns false (having said why) to stop. False, with a message, on a
// missing value too.
template <class OnSwitch, class OnValue>
bool walk_flags(int argc, char** argv, const char* usage, std::initializer_list<std::string_view> switches,
                OnSwitch on_switch, OnValue on_value) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    }
    if (std::find(switches.begin(), switches.end(), flag) != switches.end()) {
      on_switch(flag);
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n%s", flag.c_str(), usage);
      return false;
    }
    if (!on_value(flag, std::string(argv[++i]))) return false;
  }
  return true;
}

struct ModelBenchFlags {
  int layers = 0;
  int prompt = 0;
  int tokens = 0;
};

// An integer flag `--name N` of a bench: where it goes and its least value.
struct IntFlag {
  const char* name;
  int* target;
  int min;
};

// Parses `--name N` pairs over the targets' defaults; false (with a message
// on stderr) on an unknown flag, a missing value or a value below its min.
inline bool parse_int_flags(int argc, char** argv, std::initializer_list<IntFlag> known) {
  std::string names;
  for (const IntFlag& f : known) names += std::string(names.empty() ? "" : " ") + f.name;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", flag.c_str());
      return false;
    }
    const int value = std::atoi(argv[i + 1]);
    const IntFlag* match = nullptr;
    for (const IntFlag& f : known)
      if (flag == f.name) match = &f;
    if (match == nullptr || value < match->min) {
      std::fprintf(stderr, "unknown flag or bad value: %s %s (flags: %s)\n", flag.c_str(), argv[i + 1],
                   names.c_str());
      return false;
    }
    *match->target = value;
  }
  return true;
}

// Parses --layers N --prompt N --tokens N over the given defaults (each >= 1).
inline bool parse_model_bench_flags(int argc, char** argv, ModelBenchFlags* flags) {
  return parse_int_flags(
      argc, argv, {{"--layers", &flags->layers, 1}, {"--prompt", &flags->prompt, 1}, {"--tokens", &flags->tokens, 1}});
}

struct GenerationTiming {
  double prefill_s = 0;  // prompt in, first token out
  double decode_s = 0;   // the decode steps after the first token
};

// Greedy generation of 1 + decode_tokens tokens: a warm-up run (which also
// pages the weights in), then the best of two timed runs. The first token's
// timestamp ends the prefill; the rest are decode steps.
inline GenerationTiming time_generation(Model& model, Backend& backend,
                                        std::span<const int32_t> prompt, int decode_tokens) {
  GenerateOptions options;
  options.temperature = 0;
  options.ignore_eos = true;
  options.max_tokens = 1 + decode_tokens;
  std::vector<Clock::time_point> token_times;
  auto on_token = [&](int32_t) { token_times.push_back(Clock::now()); };
  GenerationTiming best{1e30, 1e30};
  for (int run = 0; run < 3; ++run) {
    token_times.clear();
    const auto start = Clock::now();
    generate(model, backend, prompt, options, on_token);
    if (run == 0) continue;
    best.prefill_s = std::min(
        best.prefill_s, std::chrono::duration<double>(token_times.front() - start).count());
    best.decode_s = std::min(
        best.decode_s,
        std::chrono::duration<double>(token_times.back() - token_times.front()).count());
  }
  return best;
}

}  // namespace basalt::bench

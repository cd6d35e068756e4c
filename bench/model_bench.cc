// Prefill and decode speed of any model directory on the CPU backend, in the
// terms llama.cpp's llama-bench uses, so the two can run side by side on the
// same weights (bench/peers/llama_cpp/compare.sh):
//
//   basalt_bench_model --model DIR [--prompt 128,512] [--tokens 64] [--repeats 1] [--json]
//                      [--dtype auto|bfloat16|float32]
//
// ppN: a prompt of N tokens prefilled from an empty cache, in one step, until
// its first token is out (tokens/s = N / seconds). tgN: N tokens decoded one
// per step after a one-token prompt (tokens/s = N / seconds of those steps).
// Prompts are fixed pseudo-random ids below the vocabulary size (as
// llama-bench draws them). The path is `basalt generate`'s: load_model, then
// generate() with greedy sampling and eos ignored; the thread count is the
// global pool's (BASALT_NUM_THREADS, as everywhere); --dtype is `basalt
// generate`'s (how bf16 weights meet the activations; auto by default).
// One warm-up generation pages the weights in; then each test runs `repeats`
// times and its median is printed, or one JSON object with every figure.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "runtime/generator.h"
#include "bench_util.h"

namespace {

using namespace basalt;
using namespace basalt::bench;

struct Flags {
  std::string model;
  std::vector<int> prompts = {128, 512};
  int tokens = 64;
  int repeats = 1;
  bool json = false;
  std::string dtype = "auto";
};

const char* const kUsage =
    "usage: basalt_bench_model --model DIR [--prompt 128,512] [--tokens 64] [--repeats 1] [--json]\n"
    "                          [--dtype auto|bfloat16|float32]\n";

bool parse_positive(const std::string& text, int* out) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < 1 || value > 1 << 20) return false;
  *out = static_cast<int>(value);
  return true;
}

bool parse(int argc, char** argv, Flags* f) {
  const bool walked = walk_flags(
      argc, argv, kUsage, {"--json"}, [&](const std::string&) { f->json = true; },
      [&](const std::string& flag, const std::string& value) {
        bool ok = true;
        if (flag == "--model") {
          f->model = value;
        } else if (flag == "--prompt") {
          f->prompts.clear();
          for (size_t start = 0; ok && start <= value.size();) {
            size_t comma = value.find(',', start);
            if (comma == std::string::npos) comma = value.size();
            int n = 0;
            ok = parse_positive(value.substr(start, comma - start), &n);
            f->prompts.push_back(n);
            start = comma + 1;
          }
        } else if (flag == "--tokens") {
          ok = parse_positive(value, &f->tokens);
        } else if (flag == "--repeats") {
          ok = parse_positive(value, &f->repeats);
        } else if (flag == "--dtype") {
          f->dtype = value;
          if (value != "auto" && value != "bfloat16" && value != "float32") {
            std::fprintf(stderr, "--dtype %s: expected auto, bfloat16 or float32\n", value.c_str());
            return false;
          }
        } else {
          std::fprintf(stderr, "unknown flag %s\n%s", flag.c_str(), kUsage);
          return false;
        }
        if (!ok) std::fprintf(stderr, "%s: not a positive count (or list of them): %s\n", flag.c_str(), value.c_str());
        return ok;
      });
  if (!walked) return false;
  if (f->model.empty()) {
    std::fprintf(stderr, "--model is required\n%s", kUsage);
    return false;
  }
  return true;
}

std::vector<int32_t> prompt_ids(int n, int64_t vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int32_t& id : ids) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(vocab));
  }
  return ids;
}

// Seconds of the prefill (prompt in, first token out) and of the decode
// steps after it, for one greedy generation of 1 + decode_tokens tokens.
GenerationTiming run_once(Model& model, Backend& backend, const std::vector<int32_t>& prompt, int decode_tokens) {
  GenerateOptions options;
  options.temperature = 0;
  options.ignore_eos = true;
  options.max_tokens = 1 + decode_tokens;
  std::vector<Clock::time_point> times;
  const auto start = Clock::now();
  generate(model, backend, prompt, options, [&](int32_t) { times.push_back(Clock::now()); });
  return {std::chrono::duration<double>(times.front() - start).count(),
          std::chrono::duration<double>(times.back() - times.front()).count()};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!parse(argc, argv, &flags)) return 2;
  try {
    CpuBackend backend;
    backend.set_bf16_activations(flags.dtype == "auto"       ? cpu::auto_bf16_activations()
                                 : flags.dtype == "float32" ? cpu::Bf16Activations::kF32
                                                            : cpu::Bf16Activations::kRounded);
    const auto load_start = Clock::now();
    auto model = load_model(flags.model, backend);
    const double load_s = seconds_since(load_start);
    const int64_t vocab = model->config().vocab_size;
    run_once(*model, backend, prompt_ids(flags.prompts.front(), vocab), 2);  // warm-up

    nlohmann::json out = {{"model", flags.model}, {"threads", ThreadPool::global().size()}, {"load_s", load_s}};
    std::vector<std::pair<std::string, double>> rows;
    for (int n : flags.prompts) {
      const auto prompt = prompt_ids(n, vocab);
      std::vector<double> tps;
      for (int r = 0; r < flags.repeats; ++r) tps.push_back(n / run_once(*model, backend, prompt, 0).prefill_s);
      rows.emplace_back("pp" + std::to_string(n), median(tps));
    }
    const auto one = prompt_ids(1, vocab);
    std::vector<double> tps;
    for (int r = 0; r < flags.repeats; ++r)
      tps.push_back(flags.tokens / run_once(*model, backend, one, flags.tokens).decode_s);
    rows.emplace_back("tg" + std::to_string(flags.tokens), median(tps));

    for (const auto& [test, value] : rows) out[test] = value;
    if (flags.json) {
      std::printf("%s\n", out.dump().c_str());
    } else {
      std::printf("%s, %d threads, loaded in %.2f s, median of %d\n", flags.model.c_str(), ThreadPool::global().size(),
                  load_s, flags.repeats);
      for (const auto& [test, value] : rows) std::printf("%-8s %10.2f tokens/s\n", test.c_str(), value);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "basalt_bench_model: %s\n", e.what());
    return 1;
  }
  return 0;
}

// Cost of the radix cache's operations on a serving-like workload: requests
// whose prompts start with one of a few long system prompts, then a private
// user turn and an output. Each request does what the scheduler will do:
// match its prompt, lock the match, allocate the rest (evicting when the pool
// is full), insert the finished sequence, release the duplicates, unlock.
//
//   basalt_bench_radix_cache [--quick]
//
// Prints the time per operation and per token for match_prefix, allocate
// (with its evictions) and insert, the hit rate, and the time of a match on
// a warm tree per matched token.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/kv_pool.h"
#include "runtime/radix_cache.h"

namespace basalt {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Totals {
  double seconds = 0;
  uint64_t calls = 0;
  uint64_t tokens = 0;
  void add(Clock::time_point start, uint64_t n) {
    seconds += seconds_since(start);
    ++calls;
    tokens += n;
  }
  void print(const char* name) const {
    fmt::print("{:<22} {:>9} calls {:>10.2f} us/call {:>8.1f} ns/token\n", name, calls,
               calls ? seconds * 1e6 / static_cast<double>(calls) : 0.0,
               tokens ? seconds * 1e9 / static_cast<double>(tokens) : 0.0);
  }
};

int run(bool quick) {
  const int64_t capacity = int64_t{1} << 20;
  const int templates = 16, system_len = 1024, user_len = 256, output_len = 128;
  const int requests = quick ? 4000 : 40000;
  std::mt19937_64 rng(1);
  std::vector<std::vector<int32_t>> system(static_cast<size_t>(templates));
  for (auto& t : system) {
    t.resize(system_len);
    for (int32_t& id : t) id = static_cast<int32_t>(rng() % 128000);
  }

  KvPool pool(capacity);
  RadixCache cache(pool);
  Totals match, allocate, insert;
  std::vector<int32_t> tokens;
  for (int r = 0; r < requests; ++r) {
    tokens = system[rng() % system.size()];
    for (int i = 0; i < user_len + output_len; ++i)
      tokens.push_back(static_cast<int32_t>(rng() % 128000));
    const std::span<const int32_t> prompt(tokens.data(), system_len + user_len);

    auto t0 = Clock::now();
    PrefixMatch m = cache.match_prefix(0, prompt);
    match.add(t0, prompt.size());
    cache.lock(m.last_node);

    const auto rest = static_cast<int64_t>(tokens.size() - m.slots.size());
    t0 = Clock::now();
    std::optional<std::vector<int32_t>> got = cache.allocate(rest);
    allocate.add(t0, static_cast<uint64_t>(rest));
    if (!got) {
      fmt::print(stderr, "pool exhausted with everything locked\n");
      return 1;
    }
    std::vector<int32_t> slots = std::move(m.slots);
    slots.insert(slots.end(), got->begin(), got->end());

    t0 = Clock::now();
    InsertResult ins = cache.insert(0, tokens, slots);
    insert.add(t0, tokens.size());
    cache.release(ins.duplicates);
    cache.unlock(m.last_node);
  }
  cache.check_invariants();

  fmt::print("{} requests: {} system prompts of {} tokens, {} user + {} output tokens each; "
             "pool {} slots\n",
             requests, templates, system_len, user_len, output_len, capacity);
  match.print("match_prefix");
  allocate.print("allocate (+evict)");
  insert.print("insert");
  const RadixCacheStats& s = cache.stats();
  fmt::print("hit rate {:.1f}% of prompt tokens; {} tokens evicted; {} cached at the end\n",
             100.0 * static_cast<double>(s.matched_tokens) /
                 static_cast<double>(std::max<uint64_t>(1, s.queried_tokens)),
             s.evicted_tokens, cache.cached_tokens());

  // Warm matches: a system prompt plus a user turn that is cached.
  Totals warm;
  std::vector<int32_t> query = system[0];
  query.resize(system_len + 1, 7);
  for (int i = 0; i < (quick ? 20000 : 200000); ++i) {
    query[system_len] = static_cast<int32_t>(i % 1000);
    const auto t0 = Clock::now();
    PrefixMatch m = cache.match_prefix(0, query);
    warm.add(t0, m.slots.size());
  }
  warm.print("warm match (hit)");
  return 0;
}

}  // namespace
}  // namespace basalt

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  return basalt::run(quick);
}

#include "router/policy.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace basalt::router {
namespace {

// FNV-1a then a 64-bit finalizer (splitmix64's): rendezvous scores need
// every bit to move with key and id.
uint64_t mix(std::string_view key, std::string_view id) {
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  h = (h ^ 0xff) * 1099511628211ull;  // a separator: ("ab","c") is not ("a","bc")
  for (const unsigned char c : id) h = (h ^ c) * 1099511628211ull;
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

std::vector<size_t> rotated(size_t n, uint64_t turn) {
  std::vector<size_t> order(n);
  for (size_t k = 0; k < n; ++k) order[k] = (turn + k) % n;
  return order;
}

}  // namespace

Policy parse_policy(std::string_view name, std::string_view flag) {
  if (name == "cache-aware") return Policy::kCacheAware;
  if (name == "round-robin") return Policy::kRoundRobin;
  if (name == "least-load") return Policy::kLeastLoad;
  if (name == "power-of-two") return Policy::kPowerOfTwo;
  if (name == "session") return Policy::kSession;
  fail("{} {}: expected cache-aware, round-robin, least-load, power-of-two or session", flag, name);
}

const char* policy_name(Policy policy) {
  switch (policy) {
    case Policy::kCacheAware: return "cache-aware";
    case Policy::kRoundRobin: return "round-robin";
    case Policy::kLeastLoad: return "least-load";
    case Policy::kPowerOfTwo: return "power-of-two";
    case Policy::kSession: return "session";
  }
  return "round-robin";
}

std::vector<size_t> preference(Policy policy, std::span<const Candidate> candidates, const PickInput& in) {
  const size_t n = candidates.size();
  std::vector<size_t> order = rotated(n, in.turn);
  const uint64_t random = in.random;
  const std::string_view session_key = in.session;
  const auto by_load = [&](size_t a, size_t b) { return candidates[a].load < candidates[b].load; };
  switch (policy) {
    case Policy::kRoundRobin:
      break;
    case Policy::kCacheAware: {
      if (n == 0) break;
      int64_t least = candidates[0].load;
      double best = 0;
      for (const Candidate& c : candidates) {
        least = std::min(least, c.load);
        best = std::max(best, c.cached);
      }
      const auto overloaded = [&](size_t i) {
        const int64_t load = candidates[i].load;
        return load - least > in.balance_abs && static_cast<double>(load) > in.balance_rel * static_cast<double>(least);
      };
      const bool use_cache = best > 0 && best >= in.cache_threshold;
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        if (overloaded(a) != overloaded(b)) return !overloaded(a);
        if (use_cache && candidates[a].cached != candidates[b].cached) return candidates[a].cached > candidates[b].cached;
        return candidates[a].load < candidates[b].load;
      });
      break;
    }
    case Policy::kLeastLoad:
      std::stable_sort(order.begin(), order.end(), by_load);
      break;
    case Policy::kPowerOfTwo: {
      if (n < 2) break;
      const size_t first = random % n;
      const size_t second = (first + 1 + (random / n) % (n - 1)) % n;  // another one
      std::stable_sort(order.begin(), order.end(), by_load);
      std::erase(order, first);
      std::erase(order, second);
      const bool swap = candidates[second].load < candidates[first].load;
      order.insert(order.begin(), swap ? first : second);
      order.insert(order.begin(), swap ? second : first);
      break;
    }
    case Policy::kSession: {
      if (session_key.empty()) break;
      std::vector<uint64_t> score(n);
      for (size_t i = 0; i < n; ++i) score[i] = mix(session_key, candidates[i].id);
      std::iota(order.begin(), order.end(), size_t{0});
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return score[a] != score[b] ? score[a] > score[b] : candidates[a].id < candidates[b].id;
      });
      break;
    }
  }
  return order;
}

}  // namespace basalt::router

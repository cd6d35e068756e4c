#include "router/prefix_index.h"

namespace basalt::router {
namespace {

uint64_t fnv1a(uint64_t h, std::string_view bytes) {
  for (const unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

std::vector<uint64_t> PrefixIndex::blocks(std::string_view scope, std::string_view text) const {
  std::vector<uint64_t> out;
  uint64_t h = fnv1a(1469598103934665603ull, scope);
  h = fnv1a(h, std::string_view("\x1f", 1));  // scope "ab" + text "c" is not scope "a" + text "bc"
  for (size_t at = 0; at + options_.block_bytes <= text.size() && out.size() < options_.max_blocks;
       at += options_.block_bytes) {
    h = fnv1a(h, text.substr(at, options_.block_bytes));
    out.push_back(h);
  }
  return out;
}

std::vector<size_t> PrefixIndex::match(std::span<const std::string_view> replicas, std::span<const uint64_t> blocks,
                                       Clock::time_point now, std::span<const Clock::duration> max_age) const {
  std::vector<size_t> matched(replicas.size(), 0);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t r = 0; r < replicas.size(); ++r) {
    const auto it = held_.find(replicas[r]);
    if (it == held_.end()) continue;
    const Clock::duration ttl = r < max_age.size() ? max_age[r] : Clock::duration(options_.ttl);
    size_t n = 0;
    for (const uint64_t b : blocks) {
      const auto found = it->second.at.find(b);
      if (found == it->second.at.end() || now - found->second.second > ttl) break;
      ++n;
    }
    matched[r] = n;
  }
  return matched;
}

void PrefixIndex::insert(std::string_view replica, std::span<const uint64_t> blocks, Clock::time_point now) {
  if (blocks.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find(replica);
  if (it == held_.end()) it = held_.emplace(std::string(replica), Held{}).first;
  Held& h = it->second;
  // Last block first, so that a prompt's first blocks, which every longer
  // match goes through, are the last of it to be evicted.
  for (auto b_it = blocks.rbegin(); b_it != blocks.rend(); ++b_it) {
    const uint64_t b = *b_it;
    const auto found = h.at.find(b);
    if (found != h.at.end()) {
      h.lru.splice(h.lru.begin(), h.lru, found->second.first);
      found->second.second = now;
      continue;
    }
    h.lru.push_front(b);
    h.at.emplace(b, std::make_pair(h.lru.begin(), now));
  }
  while (h.at.size() > options_.max_entries_per_replica) {
    h.at.erase(h.lru.back());
    h.lru.pop_back();
  }
}

size_t PrefixIndex::entries(std::string_view replica) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = held_.find(replica);
  return it == held_.end() ? 0 : it->second.at.size();
}

}  // namespace basalt::router

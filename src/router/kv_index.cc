#include "router/kv_index.h"

namespace basalt::router {

void KvIndex::reset(std::string_view replica, int32_t block_size) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(replica);
  if (it == live_.end()) it = live_.emplace(std::string(replica), Held{}).first;
  it->second.block_size = block_size;
  it->second.hashes.clear();
}

void KvIndex::drop(std::string_view replica) {
  std::lock_guard<std::mutex> lock(mu_);
  if (const auto it = live_.find(replica); it != live_.end()) live_.erase(it);
}

bool KvIndex::stored(std::string_view replica, std::span<const uint64_t> hashes) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = live_.find(replica);
  if (it == live_.end()) return true;
  for (const uint64_t h : hashes) it->second.hashes.insert(h);
  if (it->second.hashes.size() <= max_blocks_) return true;
  live_.erase(it);
  return false;
}

void KvIndex::removed(std::string_view replica, std::span<const uint64_t> hashes) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = live_.find(replica);
  if (it == live_.end()) return;
  for (const uint64_t h : hashes) it->second.hashes.erase(h);
}

int32_t KvIndex::block_size(std::string_view replica) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = live_.find(replica);
  return it == live_.end() ? 0 : it->second.block_size;
}

std::optional<size_t> KvIndex::match(std::string_view replica, std::span<const uint64_t> hashes) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = live_.find(replica);
  if (it == live_.end()) return std::nullopt;
  size_t n = 0;
  while (n < hashes.size() && it->second.hashes.count(hashes[n]) != 0) ++n;
  return n;
}

size_t KvIndex::blocks(std::string_view replica) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = live_.find(replica);
  return it == live_.end() ? 0 : it->second.hashes.size();
}

}  // namespace basalt::router

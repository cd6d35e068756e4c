#include "router/placement.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

namespace basalt::router {

bool valid_placement_name(std::string_view name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.';
  });
}

bool region_allowed(std::span<const std::string> allowed, std::string_view region) {
  if (allowed.empty()) return true;
  return !region.empty() && std::find(allowed.begin(), allowed.end(), region) != allowed.end();
}

AllowedRegions allowed_regions(std::span<const std::string> tenant_regions,
                               std::optional<std::string_view> header) {
  AllowedRegions out;
  if (!header) {
    out.regions.assign(tenant_regions.begin(), tenant_regions.end());
    return out;
  }
  constexpr size_t kMaxRegions = 16;
  std::string_view rest = *header;
  while (true) {
    const size_t comma = rest.find(',');
    std::string_view name = rest.substr(0, comma);
    while (!name.empty() && (name.front() == ' ' || name.front() == '\t')) name.remove_prefix(1);
    while (!name.empty() && (name.back() == ' ' || name.back() == '\t')) name.remove_suffix(1);
    if (!valid_placement_name(name) || out.regions.size() == kMaxRegions) {
      out.status = 400;
      out.message =
          "X-Basalt-Region must be a comma-separated list of at most 16 region names (1-64 "
          "letters, digits, '-', '_' or '.')";
      out.regions.clear();
      return out;
    }
    if (!tenant_regions.empty() && !region_allowed(tenant_regions, name)) {
      out.status = 403;
      out.message = "X-Basalt-Region names a region this API key may not use: " + std::string(name);
      out.regions.clear();
      return out;
    }
    if (std::find(out.regions.begin(), out.regions.end(), name) == out.regions.end())
      out.regions.emplace_back(name);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return out;
}

double estimated_queue_ms(const PoolLoad& load) {
  if (!(load.prefill_tokens_per_s > 0)) return std::numeric_limits<double>::infinity();
  const double tokens =
      std::max(0.0, load.queued_tokens) + std::max(0.0, load.pending_prefill_tokens);
  return tokens / load.prefill_tokens_per_s * 1000;
}

bool OverflowTracker::observe(const std::string& pool, const std::string& class_name, double eqt_ms,
                              int64_t slo_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  bool& overflowing = overflowing_[{pool, class_name}];
  const double slo = static_cast<double>(slo_ms);
  if (!overflowing && eqt_ms > slo) {
    overflowing = true;
  } else if (overflowing && eqt_ms < 0.8 * slo) {
    overflowing = false;
  }
  return overflowing;
}

std::map<std::pair<std::string, std::string>, bool> OverflowTracker::states() const {
  std::lock_guard<std::mutex> lock(mu_);
  return overflowing_;
}

std::optional<size_t> choose_overflow_pool(std::span<const OverflowOption> options,
                                           int64_t slo_ms) {
  std::optional<size_t> best;
  for (size_t i = 0; i < options.size(); ++i) {
    const OverflowOption& o = options[i];
    if (!o.reachable || !(o.eqt_ms < static_cast<double>(slo_ms))) continue;
    if (!best || o.eqt_ms < options[*best].eqt_ms) best = i;
  }
  return best;
}

void QueuedTokens::add(const std::string& pool, int64_t tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  tokens_[pool] += tokens;
}

void QueuedTokens::remove(const std::string& pool, int64_t tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = tokens_.find(pool);
  if (it == tokens_.end()) return;
  it->second = std::max<int64_t>(0, it->second - tokens);
  if (it->second == 0) tokens_.erase(it);
}

int64_t QueuedTokens::of(const std::string& pool) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = tokens_.find(pool);
  return it == tokens_.end() ? 0 : it->second;
}

int64_t QueuedTokens::total() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& [pool, tokens] : tokens_) n += tokens;
  return n;
}

}  // namespace basalt::router

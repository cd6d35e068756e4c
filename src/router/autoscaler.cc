#include "router/autoscaler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "router/placement.h"

namespace basalt::router {

namespace {

constexpr double kUpFactor = 1.1;
constexpr double kDownFactor = 0.7;
constexpr int64_t kMaxReplicas = 1000;
constexpr double kMaxSeconds = 86400;

// A decimal number, all of `text`.
std::optional<double> number(std::string_view text) {
  if (text.empty() || text.size() > 32) return std::nullopt;
  const std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  // strtod also takes hex floats, "inf" and "nan" (the last two not finite above).
  if (s.find_first_of("xX") != std::string::npos) return std::nullopt;
  return v;
}

// Seconds: a number, alone or with s, m or h.
std::optional<double> seconds(std::string_view text) {
  double unit = 1;
  if (!text.empty() && (text.back() == 's' || text.back() == 'm' || text.back() == 'h')) {
    unit = text.back() == 's' ? 1 : text.back() == 'm' ? 60 : 3600;
    text.remove_suffix(1);
  }
  const std::optional<double> v = number(text);
  if (!v) return std::nullopt;
  return *v * unit;
}

std::optional<int64_t> whole(std::string_view text) {
  const std::optional<double> v = number(text);
  if (!v || *v != std::floor(*v) || std::abs(*v) > 1e15) return std::nullopt;
  return static_cast<int64_t>(*v);
}

std::string trimmed_number(double v) { return fmt::format("{:.4g}", v); }

}  // namespace

const char* autoscale_metric_name(AutoscaleMetric metric) {
  switch (metric) {
    case AutoscaleMetric::kConcurrency: return "concurrency";
    case AutoscaleMetric::kQueueTime: return "queue_time";
    case AutoscaleMetric::kTtftP95: return "ttft_p95";
  }
  return "concurrency";
}

AutoscaleConfig parse_autoscale(std::string_view text, std::string_view where) {
  AutoscaleConfig c;
  std::set<std::string, std::less<>> seen;
  bool target_given = false;
  size_t at = 0;
  while (at < text.size()) {
    if (text[at] == ' ' || text[at] == '\t') {
      ++at;
      continue;
    }
    size_t end = text.find_first_of(" \t", at);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view item = text.substr(at, end - at);
    at = end;
    const size_t eq = item.find('=');
    BASALT_CHECK(eq != std::string_view::npos && eq > 0,
                 "{} '{}': '{}' is not key=value (keys: pool, metric, target, min, max, up_after, down_after)", where,
                 text, item);
    const std::string_view key = item.substr(0, eq);
    const std::string_view value = item.substr(eq + 1);
    BASALT_CHECK(seen.insert(std::string(key)).second, "{} '{}': {} is given twice", where, text, key);
    if (key == "pool") {
      BASALT_CHECK(valid_placement_name(value),
                   "{} '{}': pool '{}' is not a pool name (1-64 letters, digits, '-', '_' or '.')", where, text, value);
      c.pool = std::string(value);
    } else if (key == "metric") {
      if (value == "concurrency")
        c.metric = AutoscaleMetric::kConcurrency;
      else if (value == "queue_time")
        c.metric = AutoscaleMetric::kQueueTime;
      else if (value == "ttft_p95")
        c.metric = AutoscaleMetric::kTtftP95;
      else
        fail("{} '{}': metric '{}' is not concurrency, queue_time or ttft_p95", where, text, value);
    } else if (key == "target") {
      const std::optional<double> v = number(value);
      BASALT_CHECK(v && *v > 0 && *v <= 1e6, "{} '{}': target '{}' must be a number above 0 (at most 1e6)", where,
                   text, value);
      c.target = *v;
      target_given = true;
    } else if (key == "min" || key == "max") {
      const std::optional<int64_t> v = whole(value);
      BASALT_CHECK(v && *v >= 0 && *v <= kMaxReplicas, "{} '{}': {} '{}' must be a whole number in [0, {}]", where,
                   text, key, value, kMaxReplicas);
      (key == "min" ? c.min_replicas : c.max_replicas) = *v;
    } else if (key == "up_after" || key == "down_after") {
      const std::optional<double> v = seconds(value);
      BASALT_CHECK(v && *v >= 0 && *v <= kMaxSeconds,
                   "{} '{}': {} '{}' must be seconds in [0, {}] (a number, or with s, m or h: 30s, 5m)", where, text,
                   key, value, kMaxSeconds);
      (key == "up_after" ? c.up_after_s : c.down_after_s) = *v;
    } else {
      fail("{} '{}': unknown key '{}' (keys: pool, metric, target, min, max, up_after, down_after)", where, text, key);
    }
  }
  // A target in seconds has no default that fits every model: say it.
  BASALT_CHECK(target_given || c.metric == AutoscaleMetric::kConcurrency,
               "{} '{}': metric {} needs a target (seconds)", where, text, autoscale_metric_name(c.metric));
  BASALT_CHECK(c.max_replicas >= 1, "{} '{}': max must be at least 1", where, text);
  BASALT_CHECK(c.min_replicas <= c.max_replicas, "{} '{}': min ({}) is above max ({})", where, text, c.min_replicas,
               c.max_replicas);
  return c;
}

PoolAutoscaler::PoolAutoscaler(AutoscaleConfig config) : config_(std::move(config)) {
  BASALT_CHECK(config_.target > 0 && config_.max_replicas >= 1 && config_.min_replicas >= 0 &&
                   config_.min_replicas <= config_.max_replicas,
               "autoscaler of pool '{}': needs target > 0 and 0 <= min <= max, max >= 1", config_.pool);
}

AutoscaleDecision PoolAutoscaler::observe(const AutoscaleObservation& o) {
  const AutoscaleConfig& c = config_;
  const double observed = std::isnan(o.observed) ? 0 : o.observed;
  const int64_t ready = std::max<int64_t>(0, o.ready);
  const auto clamp = [&](int64_t n) { return std::clamp(n, c.min_replicas, c.max_replicas); };
  int64_t proposal = c.min_replicas;
  if (ready > 0) {
    const double raw = std::ceil(static_cast<double>(ready) * observed / c.target);
    proposal = !std::isfinite(raw) || raw > static_cast<double>(c.max_replicas) ? c.max_replicas
                                                                               : clamp(static_cast<int64_t>(raw));
  }
  const bool above = observed > kUpFactor * c.target;
  const bool below = observed < kDownFactor * c.target;
  const std::string values = fmt::format("{} {} against target {}", autoscale_metric_name(c.metric),
                                         trimmed_number(observed), trimmed_number(c.target));
  // Each streak begins at its condition's first observation in a row.
  if (above) {
    if (!above_since_) above_since_ = o.now_s;
  } else {
    above_since_.reset();
  }
  if (below) {
    if (!below_since_) below_since_ = o.now_s;
  } else {
    below_since_.reset();
  }
  AutoscaleDecision d;
  const std::optional<int64_t> before = desired_;
  if (!desired_) {
    desired_ = clamp(ready);
    d.reason = fmt::format("first observation: {} ready replica(s), within [{}, {}]", ready, c.min_replicas,
                           c.max_replicas);
  } else if (above) {
    const double held = o.now_s - *above_since_;
    if (held >= c.up_after_s && proposal > *desired_) {
      d.reason = fmt::format("{}: above {} x target for {}s (up_after {}s): ceil({} x {} / {}) = {}", values,
                             kUpFactor, trimmed_number(held), trimmed_number(c.up_after_s), ready,
                             trimmed_number(observed), trimmed_number(c.target), proposal);
      desired_ = proposal;
    } else if (held >= c.up_after_s) {
      d.reason = fmt::format("{}: above {} x target, but {} replica(s) are enough for what the ready ones carry{}",
                             values, kUpFactor, *desired_, *desired_ == c.max_replicas ? " (max)" : "");
    } else {
      d.reason = fmt::format("{}: above {} x target for {}s of up_after {}s: holding", values, kUpFactor,
                             trimmed_number(held), trimmed_number(c.up_after_s));
    }
  } else if (below) {
    const double held = o.now_s - *below_since_;
    if (held >= c.down_after_s && proposal < *desired_) {
      desired_ = std::max(*desired_ - 1, proposal);
      d.reason = fmt::format("{}: below {} x target for {}s (down_after {}s): one step down", values, kDownFactor,
                             trimmed_number(held), trimmed_number(c.down_after_s));
    } else if (held >= c.down_after_s) {
      d.reason = fmt::format("{}: below {} x target, at {}", values, kDownFactor,
                             *desired_ == c.min_replicas ? "min" : "what the load needs");
    } else {
      d.reason = fmt::format("{}: below {} x target for {}s of down_after {}s: holding", values, kDownFactor,
                             trimmed_number(held), trimmed_number(c.down_after_s));
    }
  } else {
    d.reason = fmt::format("{}: within {} to {} x target: holding", values, kDownFactor, kUpFactor);
  }
  if (o.waiting > 0 && ready == 0) {
    desired_ = std::max<int64_t>(*desired_, 1);
    d.reason = fmt::format("{} request(s) wait with no replica ready: scaling from zero to {}", o.waiting, *desired_);
  }
  if (before && *desired_ != *before) {
    // Both times restart here: the next raise needs up_after more, the next step down down_after more.
    above_since_ = above ? std::optional<double>(o.now_s) : std::nullopt;
    below_since_ = below ? std::optional<double>(o.now_s) : std::nullopt;
  }
  d.desired = *desired_;
  return d;
}

}  // namespace basalt::router

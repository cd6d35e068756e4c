#include "runtime/stop_checker.h"

#include <algorithm>

#include "core/error.h"

namespace basalt {

StopChecker::StopChecker(std::vector<std::string> stops, bool include_stop)
    : stops_(std::move(stops)), include_stop_(include_stop) {
  for (const std::string& s : stops_) {
    BASALT_CHECK(!s.empty(), "stop strings must not be empty");
    max_stop_ = std::max(max_stop_, s.size());
  }
}

size_t StopChecker::held_length() const {
  const size_t longest = std::min(pending_.size(), max_stop_ == 0 ? 0 : max_stop_ - 1);
  const std::string_view text(pending_);
  for (size_t len = longest; len > 0; --len) {
    const std::string_view suffix = text.substr(text.size() - len);
    for (const std::string& s : stops_)
      if (s.size() > len && std::string_view(s).substr(0, len) == suffix) return len;
  }
  return 0;
}

StopChecker::Result StopChecker::feed(std::string_view piece, bool check) {
  Result result;
  if (stopped_) return result;
  pending_.append(piece);
  if (!check) {
    unchecked_end_ = pending_.size();
  } else if (!stops_.empty()) {
    // Earliest end first; at equal ends the longest stop (earliest start).
    size_t best_end = std::string::npos, best_start = 0;
    const std::string* best = nullptr;
    for (const std::string& s : stops_) {
      // Only ends past unchecked_end_ count; start the search where such a
      // match could begin.
      const size_t from = unchecked_end_ + 1 > s.size() ? unchecked_end_ + 1 - s.size() : 0;
      const size_t at = pending_.find(s, from);
      if (at == std::string::npos) continue;
      const size_t end = at + s.size();
      if (end < best_end || (end == best_end && at < best_start)) {
        best_end = end;
        best_start = at;
        best = &s;
      }
    }
    if (best != nullptr) {
      result.text = pending_.substr(0, include_stop_ ? best_end : best_start);
      result.stop = *best;
      pending_.clear();
      unchecked_end_ = 0;
      stopped_ = true;
      return result;
    }
  }
  const size_t emit = pending_.size() - held_length();
  result.text = pending_.substr(0, emit);
  pending_.erase(0, emit);
  unchecked_end_ = unchecked_end_ > emit ? unchecked_end_ - emit : 0;
  return result;
}

std::string StopChecker::flush() {
  std::string rest = std::move(pending_);
  pending_.clear();
  unchecked_end_ = 0;
  return rest;
}

}  // namespace basalt

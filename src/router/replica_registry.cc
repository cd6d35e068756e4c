#include "router/replica_registry.h"

#include <cctype>
#include <fmt/format.h>
#include <set>

#include "core/error.h"

namespace basalt::router {

namespace {

std::vector<std::string_view> words(std::string_view text) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (at < text.size()) {
    while (at < text.size() && std::isspace(static_cast<unsigned char>(text[at]))) ++at;
    const size_t start = at;
    while (at < text.size() && !std::isspace(static_cast<unsigned char>(text[at]))) ++at;
    if (at > start) out.push_back(text.substr(start, at - start));
  }
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

uint64_t ReplicaState::attempt_started() {
  in_flight.fetch_add(1);
  std::lock_guard<std::mutex> lock(mu);
  ++sent_since_scrape;
  ++unanswered_since_scrape;
  return scrape_generation;
}

void ReplicaState::attempt_answering(uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu);
  if (generation == scrape_generation && unanswered_since_scrape > 0) --unanswered_since_scrape;
}

void ReplicaState::attempt_ended(uint64_t generation, bool answering) {
  in_flight.fetch_sub(1);
  std::lock_guard<std::mutex> lock(mu);
  // One started before the last scrape is in that scrape's numbers.
  if (generation != scrape_generation) return;
  if (sent_since_scrape > 0) --sent_since_scrape;
  if (!answering && unanswered_since_scrape > 0) --unanswered_since_scrape;
}

std::string canonical_url(const BaseUrl& url) {
  const std::string host = lower(url.host);
  const bool v6 = host.find(':') != std::string::npos;
  return lower(url.scheme) + "://" + (v6 ? "[" + host + "]" : host) + ":" + url.port + url.prefix;
}

ReplicaSpec parse_replica(std::string_view text, std::string_view where) {
  const std::vector<std::string_view> parts = words(text);
  BASALT_CHECK(!parts.empty(), "{}: expected URL [region=R] [pool=P] [model=M]", where);
  ReplicaSpec spec;
  spec.url = parse_base_url(std::string(parts[0]), where);
  spec.id = canonical_url(spec.url);
  std::set<std::string_view> seen;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string_view part = parts[i];
    const size_t eq = part.find('=');
    BASALT_CHECK(eq != std::string_view::npos && eq > 0, "{}: '{}' is not key=value", where, part);
    const std::string_view key = part.substr(0, eq), value = part.substr(eq + 1);
    BASALT_CHECK(!value.empty(), "{}: '{}' has no value", where, key);
    BASALT_CHECK(seen.insert(key).second, "{}: '{}' is given twice", where, key);
    for (const char c : value)
      BASALT_CHECK(c > 0x20 && c < 0x7f, "{}: the value of '{}' must be printable ASCII", where, key);
    if (key == "region") spec.region = std::string(value);
    else if (key == "pool") spec.pool = std::string(value);
    else if (key == "model") spec.model = std::string(value);
    else fail("{}: unknown label '{}' (expected region, pool or model)", where, key);
  }
  return spec;
}

std::vector<ReplicaSpec> parse_replica_file(std::string_view text, std::string_view name) {
  std::vector<ReplicaSpec> specs;
  size_t line_no = 0, at = 0;
  while (at <= text.size()) {
    size_t eol = text.find('\n', at);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(at, eol - at);
    at = eol + 1;
    ++line_no;
    if (const size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    if (words(line).empty()) continue;
    specs.push_back(parse_replica(line, fmt::format("{}:{}", name, line_no)));
  }
  return specs;
}

const Replica* Snapshot::find(std::string_view id) const {
  for (const Replica& r : replicas)
    if (r.spec.id == id) return &r;
  return nullptr;
}

void ReplicaRegistry::set(std::vector<ReplicaSpec> specs) {
  BASALT_CHECK(!specs.empty(), "no replicas: give --replica URL or --replica-file FILE");
  set_allowing_none(std::move(specs));
}

void ReplicaRegistry::set_allowing_none(std::vector<ReplicaSpec> specs) {
  std::set<std::string> ids;
  for (const ReplicaSpec& s : specs)
    BASALT_CHECK(ids.insert(s.id).second, "the replica {} is listed twice", s.id);
  std::lock_guard<std::mutex> lock(mu_);
  auto next = std::make_shared<Snapshot>();
  next->generation = current_->generation + 1;
  for (ReplicaSpec& s : specs) {
    std::shared_ptr<ReplicaState>& state = states_[s.id];
    if (!state) state = std::make_shared<ReplicaState>(breaker_);
    state->draining.store(false);
    next->replicas.push_back(Replica{std::move(s), state});
  }
  for (auto& [id, state] : states_)
    if (ids.count(id) == 0) state->draining.store(true);
  current_ = std::move(next);
}

std::shared_ptr<const Snapshot> ReplicaRegistry::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

}  // namespace basalt::router

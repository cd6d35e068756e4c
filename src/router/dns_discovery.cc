#include "router/dns_discovery.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <set>

#include "core/error.h"

namespace basalt::router {

DnsTarget parse_dns_target(std::string_view text, std::string_view where) {
  const size_t start = text.find_first_not_of(" \t");
  BASALT_CHECK(start != std::string_view::npos,
               "{}: expected HOST:PORT [region=R] [pool=P] [model=M]", where);
  const size_t end = text.find_first_of(" \t", start);
  const std::string_view address =
      text.substr(start, end == std::string_view::npos ? end : end - start);
  BASALT_CHECK(
      address.find("://") == std::string_view::npos && address.find('/') == std::string_view::npos,
      "{}: '{}' must be HOST:PORT, without a scheme or path", where, address);
  const size_t colon = address.rfind(':');
  BASALT_CHECK(colon != std::string_view::npos && colon > 0 && colon + 1 < address.size(),
               "{}: '{}' must be HOST:PORT", where, address);
  // The labels and the port are checked as a --replica of the same shape
  // would be.
  const std::string as_replica =
      fmt::format("http://{}{}", address, end == std::string_view::npos ? "" : text.substr(end));
  DnsTarget target;
  target.labels = parse_replica(as_replica, where);
  target.host = target.labels.url.host;
  target.port = target.labels.url.port;
  BASALT_CHECK(address.substr(colon + 1) == target.port, "{}: '{}' has no valid port", where,
               address);
  target.text = std::string(text.substr(start));
  return target;
}

std::vector<std::string> AsioAddressResolver::resolve(const std::string& host) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::resolver resolver(io);
  boost::system::error_code ec;
  const auto results = resolver.resolve(host, "", ec);
  // No such name, or a name without addresses: a headless Service whose
  // pods are all gone (scaled to zero) answers so.
  if (ec == boost::asio::error::host_not_found || ec == boost::asio::error::no_data) return {};
  if (ec) fail("cannot resolve {}: {}", host, ec.message());
  std::set<std::string> addresses;
  for (const auto& entry : results) addresses.insert(entry.endpoint().address().to_string());
  return {addresses.begin(), addresses.end()};
}

DnsDiscovery::DnsDiscovery(ReplicaRegistry& registry, AddressResolver& resolver,
                           std::vector<DnsTarget> targets)
    : registry_(registry), resolver_(resolver), targets_(std::move(targets)) {}

std::vector<ReplicaSpec> DnsDiscovery::compose() const {
  std::vector<ReplicaSpec> specs = fixed_;
  std::set<std::string> ids;
  for (const ReplicaSpec& s : specs) ids.insert(s.id);
  for (size_t t = 0; t < targets_.size(); ++t) {
    const auto found = addresses_.find(t);
    if (found == addresses_.end()) continue;
    for (const std::string& address : found->second) {
      ReplicaSpec spec = targets_[t].labels;
      spec.url.host = address;
      spec.id = canonical_url(spec.url);
      if (ids.insert(spec.id).second) specs.push_back(std::move(spec));
    }
  }
  return specs;
}

void DnsDiscovery::publish() {
  std::vector<ReplicaSpec> specs = compose();
  std::vector<std::string> ids;
  for (const ReplicaSpec& s : specs) ids.push_back(s.id);
  registry_.set_allowing_none(std::move(specs));
  listed_ = std::move(ids);
}

void DnsDiscovery::set_fixed(std::vector<ReplicaSpec> fixed) {
  std::set<std::string> ids;
  for (const ReplicaSpec& s : fixed)
    BASALT_CHECK(ids.insert(s.id).second, "the replica {} is listed twice", s.id);
  std::lock_guard<std::mutex> lock(mu_);
  fixed_ = std::move(fixed);
  publish();
}

RefreshResult DnsDiscovery::refresh() {
  // Resolved outside the lock: a slow DNS server must not hold up a reload.
  std::map<size_t, std::vector<std::string>> resolved;
  RefreshResult result;
  for (size_t t = 0; t < targets_.size(); ++t) {
    try {
      std::vector<std::string> addresses = resolver_.resolve(targets_[t].host);
      std::sort(addresses.begin(), addresses.end());
      addresses.erase(std::unique(addresses.begin(), addresses.end()), addresses.end());
      resolved[t] = std::move(addresses);
    } catch (const Error& e) {
      result.failures.push_back(fmt::format("{}: {}", targets_[t].host, e.what()));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [t, addresses] : resolved) addresses_[t] = std::move(addresses);
  std::vector<std::string> ids;
  for (const ReplicaSpec& s : compose()) ids.push_back(s.id);
  if (ids != listed_) {
    publish();
    result.changed = true;
  }
  return result;
}

std::vector<std::string> DnsDiscovery::listed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return listed_;
}

}  // namespace basalt::router

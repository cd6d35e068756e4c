// DnsDiscovery: replicas found by resolving host names (`basalt route
// --replica-dns`), such as a Kubernetes headless Service's name, whose A and
// AAAA records are its ready pods (docs/DEPLOY.md section 3).
//
// Contract:
//  * parse_dns_target("HOST:PORT [region=R] [pool=P] [model=M]", where)
//    reads one --replica-dns value; every address HOST resolves to becomes
//    the replica http://ADDRESS:PORT (IPv6 in brackets) with those labels.
//    A missing or bad port, a HOST with a scheme or path, or a bad label is
//    an error (basalt::Error) naming `where`.
//  * AddressResolver is what resolves: AsioAddressResolver asks the system
//    resolver (Boost.Asio, getaddrinfo) for the A and AAAA records; tests
//    inject their own. resolve() returns the addresses in text form or
//    throws basalt::Error; an empty answer is a valid answer (a pool
//    scaled to zero).
//  * DnsDiscovery publishes to a ReplicaRegistry the fixed replicas
//    (set_fixed: --replica, --replica-file) followed by the resolved ones,
//    in a stable order (by target, then address). refresh() resolves every
//    target once and publishes only when the list changed, so the registry
//    diffs it as a SIGHUP reload does: a replica that vanished drains, a
//    new one joins (the health probes admit it once /ready). A target whose
//    resolution fails keeps its last addresses (a DNS outage must not
//    drain the pool) and its failure is reported in RefreshResult. An
//    address that is also a fixed replica, or that two targets share, is
//    listed once (the first wins). The list may be empty when every source
//    is. Safe to call from several threads (one at a time inside).
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "router/replica_registry.h"

namespace basalt::router {

struct DnsTarget {
  std::string host;
  std::string port;
  std::string text;    // as given, for logs
  ReplicaSpec labels;  // region, pool and model; its url is unused
};

DnsTarget parse_dns_target(std::string_view text, std::string_view where);

class AddressResolver {
 public:
  virtual ~AddressResolver() = default;
  virtual std::vector<std::string> resolve(const std::string& host) = 0;
};

class AsioAddressResolver : public AddressResolver {
 public:
  std::vector<std::string> resolve(const std::string& host) override;
};

struct RefreshResult {
  bool changed = false;               // a new list was published
  std::vector<std::string> failures;  // "HOST: why", one per target that failed
};

class DnsDiscovery {
 public:
  DnsDiscovery(ReplicaRegistry& registry, AddressResolver& resolver,
               std::vector<DnsTarget> targets);

  // Replaces the fixed replicas and publishes (always: it is a reload).
  // Throws basalt::Error for a replica listed twice among them.
  void set_fixed(std::vector<ReplicaSpec> fixed);
  RefreshResult refresh();

  // The replicas the last publish listed, by id, for logs and tests.
  std::vector<std::string> listed() const;

 private:
  std::vector<ReplicaSpec> compose() const;  // with mu_ held
  void publish();                            // with mu_ held

  ReplicaRegistry& registry_;
  AddressResolver& resolver_;
  const std::vector<DnsTarget> targets_;
  mutable std::mutex mu_;
  std::vector<ReplicaSpec> fixed_;
  std::map<size_t, std::vector<std::string>> addresses_;  // by target index, sorted
  std::vector<std::string> listed_;
};

}  // namespace basalt::router

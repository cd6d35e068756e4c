// Test helper: the NodeLinks of `nodes` nodes of one machine, connected over
// the loopback interface (real sockets), node k's link at [k]; the leader
// listens on a free port.
#pragma once

#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/node_link.h"

namespace basalt::testing {

inline std::vector<std::unique_ptr<NodeLink>> connect_node_links(int nodes, const std::string& fingerprint = "test") {
  std::vector<std::unique_ptr<NodeLink>> links(static_cast<size_t>(nodes));
  NodeLinkOptions options;
  options.nnodes = nodes;
  options.fingerprint = fingerprint;
  options.join_timeout = std::chrono::seconds(30);
  std::promise<int> port;
  std::future<int> listening = port.get_future();
  NodeLinkOptions lead = options;
  lead.on_listening = [&](int p) { port.set_value(p); };
  std::thread leader([&] { links[0] = NodeLink::lead("127.0.0.1:0", lead); });
  const std::string address = nodes > 1 ? "127.0.0.1:" + std::to_string(listening.get()) : "";
  std::vector<std::thread> others;
  for (int k = 1; k < nodes; ++k)
    others.emplace_back([&, k] { links[static_cast<size_t>(k)] = NodeLink::join(address, k, options); });
  for (std::thread& t : others) t.join();
  leader.join();
  return links;
}

}  // namespace basalt::testing

// NodeLink: the TCP connections between the machines (nodes) of one model
// group, for ranks that span several machines (`--nnodes`): the leader
// (node 0) accepts one connection from each other node, and every exchange
// goes through it (a star).
//
// Contract:
//  * NodeLink::lead(address, options) listens on address (HOST:PORT; port 0
//    picks a free one: port() and options.on_listening say which) and waits
//    until every other node has connected and introduced itself (its node
//    rank, the node count and a fingerprint of what it runs: the model and
//    the rank layout); a node
//    whose introduction is wrong (a rank out of range or taken, another
//    node count, another fingerprint) is answered with the reason and
//    dropped, and the leader goes on waiting for the right one until
//    options.join_timeout has passed, then throws naming the nodes that
//    never came. NodeLink::join(address, node_rank, options) connects to the
//    leader, retrying until join_timeout (the leader may start later), and
//    throws with the leader's reason when it is refused.
//  * exchange(blob): every node calls it with a blob of its own, in the
//    same order of calls on every node; it returns every node's blob in
//    node order (the leader receives every node's, then sends all of them
//    to each). It is the one primitive: a broadcast from the leader is an
//    exchange in which the others send nothing; collectives build on it
//    (make_node_group). One thread calls a NodeLink at a time.
//  * A peer that goes away (its process ends, its connection breaks; TCP
//    keepalive finds a silent peer within about half a minute) makes every
//    later exchange throw basalt::Error naming the node; the link is then
//    broken for good. A frame over options.max_frame_bytes, or one that
//    does not parse, is treated the same way.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace basalt {

struct NodeLinkOptions {
  int nnodes = 1;
  std::string fingerprint;  // must be the same on every node
  std::chrono::milliseconds join_timeout{std::chrono::minutes(10)};
  uint64_t max_frame_bytes = uint64_t{1} << 36;  // 64 GiB
  // The leader's: called with the port once it listens, before it waits.
  std::function<void(int port)> on_listening;
};

class NodeLink {
 public:
  static std::unique_ptr<NodeLink> lead(const std::string& address, const NodeLinkOptions& options);
  static std::unique_ptr<NodeLink> join(const std::string& address, int node_rank, const NodeLinkOptions& options);
  ~NodeLink();
  NodeLink(const NodeLink&) = delete;
  NodeLink& operator=(const NodeLink&) = delete;

  int node_rank() const { return node_rank_; }
  int nnodes() const { return nnodes_; }
  // The port the leader listens on (the leader only).
  int port() const { return port_; }

  std::vector<std::string> exchange(const std::string& blob);

 private:
  NodeLink(int node_rank, int nnodes, uint64_t max_frame_bytes);
  void send_frame(int fd, const std::string& payload, int peer);
  std::string recv_frame(int fd, int peer);
  [[noreturn]] void broken(const std::string& why);

  int node_rank_, nnodes_, port_ = 0;
  uint64_t max_frame_bytes_;
  std::vector<int> peers_;  // leader: the socket of node k at [k] ([0] unused); others: [0], the leader's
  std::string broken_;      // why the link broke, once it has
};

// "HOST:PORT" (HOST may be a bracketed IPv6 address) split, or an error
// naming `flag`.
std::pair<std::string, int> split_host_port(const std::string& address, const char* flag);

}  // namespace basalt

#include "backend/node_link.h"

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace basalt {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kHello = "basalt-node-link 1";
constexpr uint64_t kHandshakeFrameBytes = 64 * 1024;

std::string errno_text() { return std::strerror(errno); }

// Options every link socket gets: no Nagle delay (exchanges are
// request/response), and keepalive probes that find a silent peer (a
// machine gone without closing) within about 25 s.
void tune(int fd) {
  const int on = 1, idle = 10, interval = 5, count = 3;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

// A receive timeout on fd (zero: none), for the handshake: a stray
// connection that never speaks must not hold the leader.
void receive_timeout(int fd, std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((t.count() % 1000) * 1000);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

// Writes all of data, or returns the error's text.
std::string write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t sent = ::send(fd, data, n, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return errno_text();
    }
    data += sent;
    n -= static_cast<size_t>(sent);
  }
  return {};
}

// Reads exactly n bytes, or returns why not ("closed" at end of stream).
std::string read_all(int fd, char* data, size_t n) {
  while (n > 0) {
    const ssize_t got = ::recv(fd, data, n, 0);
    if (got == 0) return "the connection was closed";
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return "no answer in time";
      return errno_text();
    }
    data += got;
    n -= static_cast<size_t>(got);
  }
  return {};
}

std::string frame_header(uint64_t n) {
  std::string h(8, '\0');
  for (int i = 0; i < 8; ++i) h[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return h;
}

// One frame: an 8-byte little-endian length, then that many bytes. Returns
// an error's text, or empty with *out filled.
std::string read_frame(int fd, uint64_t limit, std::string* out) {
  char h[8];
  if (std::string e = read_all(fd, h, 8); !e.empty()) return e;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(h[i]);
  if (n > limit) return fmt::format("a frame of {} bytes, over the limit of {}", n, limit);
  out->assign(static_cast<size_t>(n), '\0');
  return read_all(fd, out->data(), static_cast<size_t>(n));
}

std::string write_frame(int fd, const std::string& payload) {
  const std::string h = frame_header(payload.size());
  if (std::string e = write_all(fd, h.data(), h.size()); !e.empty()) return e;
  return write_all(fd, payload.data(), payload.size());
}

addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  BASALT_CHECK(rc == 0, "node link: cannot resolve '{}': {}", host, gai_strerror(rc));
  return found;
}

std::string hello(int nnodes, int node_rank, const std::string& fingerprint) {
  return fmt::format("{}\n{}\n{}\n{}", kHello, nnodes, node_rank, fingerprint);
}

}  // namespace

std::pair<std::string, int> split_host_port(const std::string& address, const char* flag) {
  const size_t colon = address.rfind(':');
  BASALT_CHECK(colon != std::string::npos && colon + 1 < address.size(),
               "{} '{}': give HOST:PORT (e.g. 10.0.0.1:5000)", flag, address);
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port_text = address.substr(colon + 1);
  int port = -1;
  if (port_text.size() <= 5 && port_text.find_first_not_of("0123456789") == std::string::npos)
    port = std::stoi(port_text);
  BASALT_CHECK(port >= 0 && port <= 65535, "{} '{}': the port must be a number in [0, 65535]", flag, address);
  return {host, port};
}

NodeLink::NodeLink(int node_rank, int nnodes, uint64_t max_frame_bytes)
    : node_rank_(node_rank), nnodes_(nnodes), max_frame_bytes_(max_frame_bytes) {}

NodeLink::~NodeLink() {
  for (int fd : peers_)
    if (fd >= 0) ::close(fd);
}

std::unique_ptr<NodeLink> NodeLink::lead(const std::string& address, const NodeLinkOptions& options) {
  BASALT_CHECK(options.nnodes >= 1 && options.nnodes <= 1024, "node link: {} nodes", options.nnodes);
  std::unique_ptr<NodeLink> link(new NodeLink(0, options.nnodes, options.max_frame_bytes));
  link->peers_.assign(static_cast<size_t>(options.nnodes), -1);
  if (options.nnodes == 1) return link;
  const auto [host, port] = split_host_port(address, "--dist-init-addr");
  addrinfo* found = resolve(host, port, true);
  int listener = -1;
  std::string why;
  for (addrinfo* a = found; a != nullptr && listener < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
      listener = fd;
    } else {
      why = errno_text();
      ::close(fd);
    }
  }
  freeaddrinfo(found);
  BASALT_CHECK(listener >= 0, "node link: cannot listen on {}: {}", address, why);
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof bound;
  getsockname(listener, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  link->port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                  : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (options.on_listening) options.on_listening(link->port_);
  // Accepts and introduces nodes until every one has joined.
  const Clock::time_point deadline = Clock::now() + options.join_timeout;
  int joined = 1;
  while (joined < options.nnodes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      std::string missing;
      for (int k = 1; k < options.nnodes; ++k)
        if (link->peers_[static_cast<size_t>(k)] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
      ::close(listener);
      fail("node link: nodes {} of {} did not join {} within {} s", missing, options.nnodes, address,
           options.join_timeout.count() / 1000.0);
    }
    pollfd p{listener, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready <= 0) continue;
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    tune(fd);
    receive_timeout(fd, std::chrono::seconds(10));
    std::string intro;
    std::string refusal = read_frame(fd, kHandshakeFrameBytes, &intro);
    int rank = -1;
    if (refusal.empty()) {
      std::istringstream in(intro);
      std::string magic, nnodes_text, rank_text, fingerprint;
      std::getline(in, magic);
      std::getline(in, nnodes_text);
      std::getline(in, rank_text);
      std::getline(in, fingerprint, '\0');
      if (magic != kHello) {
        refusal = "not a basalt node (or another version of the node link)";
      } else if (nnodes_text != std::to_string(options.nnodes)) {
        refusal = fmt::format("it runs with --nnodes {}, the leader with {}", nnodes_text, options.nnodes);
      } else if (fingerprint != options.fingerprint) {
        refusal = fmt::format("it runs '{}', the leader '{}'", fingerprint, options.fingerprint);
      } else {
        rank = rank_text.size() <= 4 && !rank_text.empty() &&
                       rank_text.find_first_not_of("0123456789") == std::string::npos
                   ? std::stoi(rank_text)
                   : -1;
        if (rank < 1 || rank >= options.nnodes)
          refusal = fmt::format("node rank {} is not in [1, {})", rank_text, options.nnodes);
        else if (link->peers_[static_cast<size_t>(rank)] >= 0)
          refusal = fmt::format("node rank {} has joined already", rank);
      }
    } else {
      refusal = "its introduction did not arrive: " + refusal;
    }
    const std::string reply = refusal.empty() ? std::string("ok") : refusal;
    const bool sent = write_frame(fd, reply).empty();
    if (!refusal.empty() || !sent) {
      ::close(fd);
      continue;
    }
    receive_timeout(fd, std::chrono::milliseconds(0));
    link->peers_[static_cast<size_t>(rank)] = fd;
    ++joined;
  }
  ::close(listener);
  return link;
}

std::unique_ptr<NodeLink> NodeLink::join(const std::string& address, int node_rank, const NodeLinkOptions& options) {
  BASALT_CHECK(options.nnodes >= 2 && options.nnodes <= 1024, "node link: {} nodes", options.nnodes);
  BASALT_CHECK(node_rank >= 1 && node_rank < options.nnodes, "node link: node rank {} of {}", node_rank,
               options.nnodes);
  const auto [host, port] = split_host_port(address, "--dist-init-addr");
  BASALT_CHECK(port > 0, "--dist-init-addr '{}': the leader's port must be given", address);
  std::unique_ptr<NodeLink> link(new NodeLink(node_rank, options.nnodes, options.max_frame_bytes));
  const Clock::time_point deadline = Clock::now() + options.join_timeout;
  std::string why = "no attempt";
  for (;;) {
    addrinfo* found = nullptr;
    try {
      found = resolve(host, port, false);
    } catch (const Error& e) {
      why = e.what();  // the leader's name may not resolve yet (a pod starting)
    }
    int fd = -1;
    for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
      fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        why = errno_text();
        ::close(fd);
        fd = -1;
      }
    }
    if (found != nullptr) freeaddrinfo(found);
    if (fd >= 0) {
      tune(fd);
      receive_timeout(fd, std::chrono::seconds(30));
      std::string reply;
      std::string e = write_frame(fd, hello(options.nnodes, node_rank, options.fingerprint));
      if (e.empty()) e = read_frame(fd, kHandshakeFrameBytes, &reply);
      if (e.empty() && reply == "ok") {
        receive_timeout(fd, std::chrono::milliseconds(0));
        link->peers_.assign(1, fd);
        return link;
      }
      ::close(fd);
      BASALT_CHECK(!e.empty(), "node link: the leader at {} refused node {}: {}", address, node_rank, reply);
      why = e;
    }
    BASALT_CHECK(Clock::now() < deadline, "node link: node {} could not join the leader at {} within {} s: {}",
                 node_rank, address, options.join_timeout.count() / 1000.0, why);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

void NodeLink::broken(const std::string& why) {
  broken_ = why;
  fail("node link: {}", why);
}

void NodeLink::send_frame(int fd, const std::string& payload, int peer) {
  if (std::string e = write_frame(fd, payload); !e.empty())
    broken(fmt::format("sending to node {} failed: {}", peer, e));
}

std::string NodeLink::recv_frame(int fd, int peer) {
  std::string out;
  if (std::string e = read_frame(fd, max_frame_bytes_, &out); !e.empty())
    broken(fmt::format("receiving from node {} failed: {}", peer, e));
  return out;
}

std::vector<std::string> NodeLink::exchange(const std::string& blob) {
  BASALT_CHECK(broken_.empty(), "node link: broken earlier ({})", broken_);
  std::vector<std::string> all(static_cast<size_t>(nnodes_));
  if (nnodes_ == 1) {
    all[0] = blob;
    return all;
  }
  if (node_rank_ == 0) {
    all[0] = blob;
    for (int k = 1; k < nnodes_; ++k) all[static_cast<size_t>(k)] = recv_frame(peers_[static_cast<size_t>(k)], k);
    for (int k = 1; k < nnodes_; ++k)
      for (const std::string& b : all) send_frame(peers_[static_cast<size_t>(k)], b, k);
    return all;
  }
  send_frame(peers_[0], blob, 0);
  for (std::string& b : all) b = recv_frame(peers_[0], 0);
  return all;
}

}  // namespace basalt

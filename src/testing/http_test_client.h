// Test helper: a blocking loopback HTTP client on a raw socket, so tests can
// send malformed or partial requests, read responses piece by piece, and
// vanish mid-response.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

namespace basalt::testing {

using namespace std::chrono_literals;

class Client {
 public:
  explicit Client(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~Client() { close(); }
  bool connected() const { return connected_; }
  void send(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }
  // Reads until `pred(received)` holds, the peer closes, or the timeout.
  template <class Pred>
  std::string read_until(Pred pred, std::chrono::milliseconds timeout = 5000ms) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (!pred(buffer_)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char chunk[4096];
      const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) {
        closed_by_peer_ = true;
        break;
      }
      buffer_.append(chunk, static_cast<size_t>(n));
    }
    return buffer_;
  }
  // One whole response (Content-Length bodies), removed from the buffer.
  std::string response(std::chrono::milliseconds timeout = 5000ms) {
    read_until(
        [](const std::string& b) {
          const size_t end = b.find("\r\n\r\n");
          if (end == std::string::npos) return false;
          const size_t cl = b.find("Content-Length: ");
          if (cl == std::string::npos || cl > end) return true;
          return b.size() >= end + 4 + std::stoul(b.substr(cl + 16));
        },
        timeout);
    const size_t end = buffer_.find("\r\n\r\n");
    if (end == std::string::npos) return std::exchange(buffer_, {});
    const size_t cl = buffer_.find("Content-Length: ");
    size_t total = end + 4;
    if (cl != std::string::npos && cl < end) total += std::stoul(buffer_.substr(cl + 16));
    total = std::min(total, buffer_.size());
    std::string r = buffer_.substr(0, total);
    buffer_.erase(0, total);
    return r;
  }
  bool wait_closed(std::chrono::milliseconds timeout) {
    read_until([](const std::string&) { return false; }, timeout);
    return closed_by_peer_;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool closed_by_peer_ = false;
  std::string buffer_;
};

// A POST with a body and Content-Length.
inline std::string post_request(const std::string& path, const std::string& body, const std::string& extra = {}) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" +
         extra + "\r\n" + body;
}

// The body of a whole response (after the blank line).
inline std::string body_of(const std::string& response) {
  const size_t end = response.find("\r\n\r\n");
  return end == std::string::npos ? std::string() : response.substr(end + 4);
}

}  // namespace basalt::testing

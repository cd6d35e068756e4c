// CompletionClient against a scripted server on a local socket: every way a server
// can misbehave is counted as an error of its kind, never a crash.
#include "loadgen/client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"

namespace basalt::loadgen {
namespace {

std::string chunked(const std::string& data) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  return size + data + "\r\n";
}

const std::string kStreamHead =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";

std::string event(const std::string& json) { return "data: " + json + "\n\n"; }

// A server that answers by request path; one thread per connection.
class ScriptedServer {
 public:
  ScriptedServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd_, 64), 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~ScriptedServer() {
    stopping_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    acceptor_.join();
    for (std::thread& t : workers_) t.join();
  }
  int port() const { return port_; }
  int connections() const { return connections_.load(); }

 private:
  void accept_loop() {
    for (;;) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      ++connections_;
      workers_.emplace_back([this, c] { serve(c); });
    }
  }

  static void send_all(int c, const std::string& s, size_t piece = 0) {
    if (piece == 0) piece = s.size();
    for (size_t at = 0; at < s.size(); at += piece) {
      if (::send(c, s.data() + at, std::min(piece, s.size() - at), MSG_NOSIGNAL) < 0) return;
      if (piece < s.size()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  void serve(int c) {
    std::string in;
    char buf[4096];
    for (;;) {
      // One request: headers, then Content-Length bytes of body.
      size_t end;
      while ((end = in.find("\r\n\r\n")) == std::string::npos) {
        const ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) return done(c);
        in.append(buf, static_cast<size_t>(n));
      }
      size_t length = 0;
      if (size_t at = in.find("Content-Length: "); at != std::string::npos && at < end)
        length = std::stoul(in.substr(at + 16));
      while (in.size() < end + 4 + length) {
        const ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) return done(c);
        in.append(buf, static_cast<size_t>(n));
      }
      const std::string path = in.substr(in.find(' ') + 1, in.find(' ', in.find(' ') + 1) - in.find(' ') - 1);
      in.erase(0, end + 4 + length);
      if (!respond(c, path)) return done(c);
    }
  }

  void done(int c) { ::close(c); }

  // false: close the connection afterwards.
  bool respond(int c, const std::string& path) {
    const std::string tok = R"({"choices":[{"index":0,"text":"tok","finish_reason":null}],"usage":null})";
    if (path == "/good") {
      std::string body = kStreamHead;
      for (int i = 0; i < 3; ++i) body += chunked(event(tok));
      body += chunked(event(R"({"choices":[{"index":0,"text":"","finish_reason":"length"}]})"));
      body += chunked(event(R"({"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3}})"));
      body += chunked("data: [DONE]\n\n") + "0\r\n\r\n";
      send_all(c, body, 3);  // tiny pieces: chunk headers and events split everywhere
      return true;
    }
    if (path == "/malformed") {
      send_all(c, kStreamHead + chunked(event(tok)) + chunked("data: {oops\n\n") + chunked("data: [DONE]\n\n") +
                      "0\r\n\r\n");
      return true;
    }
    if (path == "/error-event") {
      send_all(c, kStreamHead + chunked(event(R"({"error":{"message":"engine failed","code":500}})")) +
                      chunked("data: [DONE]\n\n") + "0\r\n\r\n");
      return true;
    }
    if (path == "/status") {
      const std::string body = R"({"error":{"message":"too many requests"}})";
      send_all(c, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\n\r\n" + body);
      return true;
    }
    if (path == "/no-done") {
      send_all(c, kStreamHead + chunked(event(tok)) + "0\r\n\r\n");
      return true;
    }
    if (path == "/cut") {
      send_all(c, kStreamHead + chunked(event(tok)) + "40\r\ndata: {\"cho");
      return false;
    }
    if (path == "/garbage") {
      send_all(c, "NOT HTTP AT ALL\r\n\r\n");
      return false;
    }
    if (path == "/close") return false;
    if (path == "/hang") {
      while (!stopping_) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return false;
    }
    send_all(c, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
    return true;
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
  std::thread acceptor_;
  std::vector<std::thread> workers_;
};

ExchangeResult exchange(boost::asio::io_context& io, CompletionClient& client, const std::string& path) {
  ExchangeResult out;
  bool called = false;
  client.send("POST", path, "{}", true, true, [&](ExchangeResult&& r) {
    EXPECT_FALSE(called);
    called = true;
    out = std::move(r);
  });
  io.restart();
  io.run();
  EXPECT_TRUE(called);
  return out;
}

TEST(CompletionClient, StreamsTokensSplitIntoTinyPiecesAndReusesTheConnection) {
  ScriptedServer server;
  boost::asio::io_context io;
  CompletionClient client(io, parse_url("http://127.0.0.1:" + std::to_string(server.port())), {});
  for (int i = 0; i < 2; ++i) {
    const ExchangeResult r = exchange(io, client, "/good");
    EXPECT_EQ(r.error, ErrorKind::kNone) << r.error_message;
    EXPECT_EQ(r.http_status, 200);
    EXPECT_EQ(r.chunk_tokens, 3);
    EXPECT_EQ(r.token_times.size(), 3u);
    EXPECT_EQ(r.usage_completion_tokens, 3);
    EXPECT_EQ(r.usage_prompt_tokens, 4);
    EXPECT_EQ(r.text, "toktoktok");
    EXPECT_GE(r.first_token_s, r.sent_s);
    EXPECT_GE(r.end_s, r.token_times.back());
  }
  EXPECT_EQ(server.connections(), 1);
}

TEST(CompletionClient, ClassifiesEveryFailure) {
  ScriptedServer server;
  boost::asio::io_context io;
  ClientOptions o;
  o.timeout_s = 0.5;
  CompletionClient client(io, parse_url("http://127.0.0.1:" + std::to_string(server.port())), o);
  struct Case {
    const char* path;
    ErrorKind kind;
    const char* message;
  };
  const Case cases[] = {
      {"/malformed", ErrorKind::kStream, "not JSON"},
      {"/error-event", ErrorKind::kStream, "engine failed"},
      {"/status", ErrorKind::kHttpStatus, "HTTP 429"},
      {"/no-done", ErrorKind::kStream, "[DONE]"},
      {"/cut", ErrorKind::kStream, "after the response began"},
      {"/garbage", ErrorKind::kStream, ""},
      {"/close", ErrorKind::kConnect, ""},
      {"/hang", ErrorKind::kTimeout, "timed out"},
      {"/good", ErrorKind::kNone, ""},  // and the client still works after all that
  };
  for (const Case& c : cases) {
    const ExchangeResult r = exchange(io, client, c.path);
    EXPECT_EQ(r.error, c.kind) << c.path << ": " << r.error_message;
    EXPECT_NE(r.error_message.find(c.message), std::string::npos) << c.path << ": " << r.error_message;
  }
  EXPECT_NE(exchange(io, client, "/status").body.find("too many requests"), std::string::npos);
}

TEST(CompletionClient, ConnectionRefusedIsAConnectError) {
  // A port that was free a moment ago and has no listener now.
  int port = 0;
  {
    ScriptedServer probe;
    port = probe.port();
  }
  boost::asio::io_context io;
  CompletionClient client(io, parse_url("http://127.0.0.1:" + std::to_string(port)), {});
  const ExchangeResult r = exchange(io, client, "/good");
  EXPECT_EQ(r.error, ErrorKind::kConnect) << r.error_message;
}

TEST(ParseUrl, ValidatesBaseUrls) {
  Url u = parse_url("http://localhost:8000");
  EXPECT_EQ(u.host, "localhost");
  EXPECT_EQ(u.port, "8000");
  EXPECT_EQ(u.prefix, "");
  u = parse_url("HTTPS://example.com/api/");
  EXPECT_EQ(u.scheme, "https");
  EXPECT_EQ(u.port, "443");
  EXPECT_EQ(u.prefix, "/api");
  u = parse_url("http://[::1]:9000/x");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, "9000");
  for (const char* bad : {"localhost:8000", "ftp://x", "http://", "http://:80", "http://h:0", "http://h:99999",
                          "http://h:8a", "http://h/?q=1", "http://u:p@h", "http://[::1"})
    EXPECT_THROW(parse_url(bad), Error) << bad;
}

}  // namespace
}  // namespace basalt::loadgen

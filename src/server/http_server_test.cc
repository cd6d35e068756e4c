// The HTTP transport against raw sockets: keep-alive, limits (413, 431, 400),
// timeouts (request, idle, stalled writes), streamed bodies in chunked
// encoding, a client leaving mid-stream (abort), the connection cap, stop()
// with producers running, the per-thread I/O model, and TLS.
#include "server/http_server.h"
#include "testing/http_test_client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#ifdef BASALT_TLS
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#endif

namespace basalt {
namespace {

using namespace std::chrono_literals;
using testing::Client;

HttpServerOptions quick_options() {
  HttpServerOptions o;
  o.port = 0;
  o.request_timeout = 2000ms;
  o.idle_timeout = 2000ms;
  o.write_timeout = 2000ms;
  o.max_body_bytes = 1024;
  return o;
}

HandlerResult echo(HttpRequest& r) {
  HttpResponse out;
  out.content_type = "text/plain";
  out.body = r.method + " " + r.path + " " + r.body;
  if (auto h = r.header("x-probe")) out.headers.emplace_back("X-Probe", std::string(*h));
  return {out, nullptr};
}

std::string post(const std::string& path, const std::string& body, const std::string& extra = {}) {
  return testing::post_request(path, body, extra);
}

TEST(HttpServer, KeepAliveServesSeveralRequestsOnOneConnection) {
  HttpServer server(quick_options(), echo);
  server.start();
  Client c(server.port());
  ASSERT_TRUE(c.connected());
  c.send(post("/a", "hello", "X-Probe: 7\r\n"));
  std::string r1 = c.response();
  EXPECT_NE(r1.find("HTTP/1.1 200 OK"), std::string::npos) << r1;
  EXPECT_NE(r1.find("X-Probe: 7"), std::string::npos);
  EXPECT_NE(r1.find("POST /a hello"), std::string::npos);
  c.send("GET /b?q=1 HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string r2 = c.response();
  EXPECT_NE(r2.find("GET /b "), std::string::npos) << r2;
  // Pipelined: two requests in one write, answered in order.
  c.send(post("/c", "1") + post("/d", "2"));
  std::string r3 = c.response();
  std::string r4 = c.response();
  EXPECT_NE(r3.find("POST /c 1"), std::string::npos) << r3;
  EXPECT_NE(r4.find("POST /d 2"), std::string::npos) << r4;
}

TEST(HttpServer, CorsAnswersPreflightsAndMarksResponsesOfAllowedOrigins) {
  HttpServerOptions o = quick_options();
  o.allowed_origins = {"https://app.example.com"};
  HttpServer server(o, echo);
  server.start();
  Client c(server.port());
  ASSERT_TRUE(c.connected());
  // A preflight: answered by the transport, never the handler.
  c.send("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: https://app.example.com\r\n"
         "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type\r\n\r\n");
  const std::string preflight = c.response();
  EXPECT_NE(preflight.find("HTTP/1.1 204"), std::string::npos) << preflight;
  EXPECT_NE(preflight.find("Access-Control-Allow-Origin: https://app.example.com"), std::string::npos);
  EXPECT_NE(preflight.find("Access-Control-Allow-Methods: GET, POST, OPTIONS"), std::string::npos);
  EXPECT_NE(preflight.find("Access-Control-Allow-Headers: authorization, content-type"), std::string::npos);
  EXPECT_NE(preflight.find("Access-Control-Max-Age: 600"), std::string::npos);
  EXPECT_EQ(preflight.find("OPTIONS /v1"), std::string::npos) << "the handler answered";
  // The request itself carries the origin back, and exposes X-Request-Id.
  c.send(post("/a", "hi", "Origin: https://app.example.com\r\n"));
  const std::string allowed = c.response();
  EXPECT_NE(allowed.find("Access-Control-Allow-Origin: https://app.example.com"), std::string::npos) << allowed;
  EXPECT_NE(allowed.find("Vary: Origin"), std::string::npos);
  EXPECT_NE(allowed.find("Access-Control-Expose-Headers: X-Request-Id, Retry-After"), std::string::npos);
  // Another origin gets nothing, and its OPTIONS goes to the handler.
  c.send(post("/b", "hi", "Origin: https://evil.example\r\n"));
  const std::string other = c.response();
  EXPECT_EQ(other.find("Access-Control"), std::string::npos) << other;
  c.send("OPTIONS /a HTTP/1.1\r\nHost: x\r\nOrigin: https://evil.example\r\nAccess-Control-Request-Method: POST\r\n\r\n");
  const std::string refused = c.response();
  EXPECT_NE(refused.find("OPTIONS /a"), std::string::npos) << refused;
  EXPECT_EQ(refused.find("Access-Control"), std::string::npos) << refused;
  // "*": any origin, and no Vary.
  HttpServerOptions any = quick_options();
  any.allowed_origins = {"*"};
  HttpServer open(any, echo);
  open.start();
  Client d(open.port());
  d.send(post("/a", "hi", "Origin: https://anything.example\r\n"));
  const std::string star = d.response();
  EXPECT_NE(star.find("Access-Control-Allow-Origin: *"), std::string::npos) << star;
  EXPECT_EQ(star.find("Vary: Origin"), std::string::npos);
  // Off by default: no CORS headers at all.
  HttpServer plain(quick_options(), echo);
  plain.start();
  Client e(plain.port());
  e.send(post("/a", "hi", "Origin: https://app.example.com\r\n"));
  EXPECT_EQ(e.response().find("Access-Control"), std::string::npos);
}

TEST(HttpServer, LimitsGetTheirStatusAndAClose) {
  HttpServer server(quick_options(), echo);
  server.start();
  {
    Client c(server.port());
    c.send(post("/big", std::string(4096, 'x')));
    std::string r = c.response();
    EXPECT_NE(r.find("HTTP/1.1 413"), std::string::npos) << r;
    EXPECT_NE(r.find("larger than the limit"), std::string::npos) << r;
    EXPECT_TRUE(c.wait_closed(2000ms));
  }
  {
    Client c(server.port());
    c.send("GET / HTTP/1.1\r\nX-Long: " + std::string(128 * 1024, 'a') + "\r\n\r\n");
    std::string r = c.response();
    EXPECT_NE(r.find("HTTP/1.1 431"), std::string::npos) << r.substr(0, 200);
  }
  {
    Client c(server.port());
    c.send("THIS IS NOT HTTP\r\n\r\n");
    std::string r = c.response();
    EXPECT_NE(r.find("HTTP/1.1 400"), std::string::npos) << r;
    EXPECT_TRUE(c.wait_closed(2000ms));
  }
  {
    Client c(server.port());
    c.send("POST / HTTP/1.1\r\nContent-Length: 12x\r\n\r\n");
    std::string r = c.response();
    EXPECT_NE(r.find("HTTP/1.1 400"), std::string::npos) << r;
  }
  // The server still works.
  Client ok(server.port());
  ok.send(post("/fine", "y"));
  EXPECT_NE(ok.response().find("200 OK"), std::string::npos);
}

TEST(HttpServer, SlowAndIdleClientsAreDropped) {
  HttpServerOptions o = quick_options();
  o.request_timeout = 300ms;
  o.idle_timeout = 300ms;
  HttpServer server(o, echo);
  server.start();
  Client slow(server.port());
  slow.send("POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc");  // never finishes
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(slow.wait_closed(3000ms));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2000ms);
  Client idle(server.port());
  idle.send(post("/", "x"));
  EXPECT_NE(idle.response().find("200 OK"), std::string::npos);
  EXPECT_TRUE(idle.wait_closed(3000ms));
  // The sessions are gone once their last handlers ran.
  for (int i = 0; i < 200 && server.open_connections() > 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server.open_connections(), 0u);
}

// Streams `count` pieces, one per wake from its own thread; records abort.
class TickerProducer : public ResponseProducer {
 public:
  TickerProducer(int count, size_t piece_size, std::atomic<int>* aborts)
      : count_(count), piece_(piece_size, 'z'), aborts_(aborts) {}
  ~TickerProducer() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  void start(std::function<void()> wake) override {
    thread_ = std::thread([this, wake] {
      for (int i = 0; i < count_ && !stop_; ++i) {
        ready_.fetch_add(1);
        wake();
        std::this_thread::sleep_for(1ms);
      }
    });
  }
  void pull(Output& out) override {
    if (!head_) {
      HttpResponse h;
      h.content_type = "text/event-stream";
      out.head = h;
      head_ = true;
    }
    // What was ready when the pull began: a ticker outrunning a slow pull
    // (64 KiB pieces under a sanitizer's memcpy) would keep it appending.
    const int ready = ready_.load();
    while (sent_ < ready) {
      out.data += piece_.empty() ? "data: " + std::to_string(sent_) + "\n\n" : piece_;
      ++sent_;
    }
    if (sent_ == count_) out.done = true;
  }
  void abort() override {
    stop_ = true;
    aborts_->fetch_add(1);
  }

 private:
  int count_;
  std::string piece_;
  std::atomic<int>* aborts_;
  std::atomic<int> ready_{0};
  int sent_ = 0;
  bool head_ = false;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::string dechunk(const std::string& body) {
  std::string out;
  size_t i = 0;
  while (i < body.size()) {
    const size_t eol = body.find("\r\n", i);
    if (eol == std::string::npos) break;
    const size_t n = std::stoul(body.substr(i, eol - i), nullptr, 16);
    if (n == 0) break;
    out += body.substr(eol + 2, n);
    i = eol + 2 + n + 2;
  }
  return out;
}

TEST(HttpServer, StreamsChunkedBodiesAndKeepsTheConnection) {
  std::atomic<int> aborts{0};
  HttpServer server(quick_options(), [&](HttpRequest& r) {
    if (r.path == "/plain") return echo(r);
    return HandlerResult{{}, std::make_unique<TickerProducer>(50, 0, &aborts)};
  });
  server.start();
  Client c(server.port());
  c.send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string raw = c.read_until([](const std::string& b) { return b.find("\r\n0\r\n\r\n") != std::string::npos; });
  ASSERT_NE(raw.find("Transfer-Encoding: chunked"), std::string::npos) << raw.substr(0, 300);
  const std::string body = dechunk(raw.substr(raw.find("\r\n\r\n") + 4));
  std::string expected;
  for (int i = 0; i < 50; ++i) expected += "data: " + std::to_string(i) + "\n\n";
  EXPECT_EQ(body, expected);
  c.send("GET /plain HTTP/1.1\r\nHost: x\r\n\r\n");
  (void)c.read_until([](const std::string& b) { return b.find("GET /plain") != std::string::npos; });
  EXPECT_EQ(aborts.load(), 0);
}

TEST(HttpServer, Http10ClientsGetACloseDelimitedStream) {
  std::atomic<int> aborts{0};
  HttpServer server(quick_options(), [&](HttpRequest&) {
    return HandlerResult{{}, std::make_unique<TickerProducer>(5, 0, &aborts)};
  });
  server.start();
  Client c(server.port());
  c.send("GET /stream HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(c.wait_closed(3000ms));
  const std::string raw = c.read_until([](const std::string&) { return true; });
  EXPECT_NE(raw.find("HTTP/1.0 200 OK"), std::string::npos) << raw;
  EXPECT_EQ(raw.find("Transfer-Encoding"), std::string::npos) << raw;
  EXPECT_NE(raw.find("\r\n\r\ndata: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n"), std::string::npos) << raw;
  EXPECT_EQ(aborts.load(), 0);
}

TEST(HttpServer, AClientLeavingMidStreamAbortsTheProducer) {
  std::atomic<int> aborts{0};
  HttpServer server(quick_options(), [&](HttpRequest&) {
    return HandlerResult{{}, std::make_unique<TickerProducer>(100000, 0, &aborts)};
  });
  server.start();
  {
    Client c(server.port());
    c.send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
    (void)c.read_until([](const std::string& b) { return b.find("data: 3\n") != std::string::npos; });
  }
  for (int i = 0; i < 200 && aborts.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(aborts.load(), 1);
  for (int i = 0; i < 200 && server.open_connections() > 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server.open_connections(), 0u);
}

TEST(HttpServer, AClientThatStopsReadingIsDroppedAfterTheWriteTimeout) {
  std::atomic<int> aborts{0};
  HttpServerOptions o = quick_options();
  o.write_timeout = 300ms;
  HttpServer server(o, [&](HttpRequest&) {
    return HandlerResult{{}, std::make_unique<TickerProducer>(100000, 64 * 1024, &aborts)};
  });
  server.start();
  Client c(server.port());
  c.send("GET /flood HTTP/1.1\r\nHost: x\r\n\r\n");
  // Up to 20 s: the loopback buffers take megabytes before a write stalls,
  // and under ASan on a loaded two-core machine 5 s was once not enough.
  for (int i = 0; i < 2000 && aborts.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(aborts.load(), 1);
}

TEST(HttpServer, PastTheConnectionCapNewClientsGet503) {
  HttpServerOptions o = quick_options();
  o.max_connections = 1;
  HttpServer server(o, echo);
  server.start();
  Client first(server.port());
  first.send(post("/", "a"));
  EXPECT_NE(first.response().find("200 OK"), std::string::npos);
  Client second(server.port());
  const std::string r = second.response();
  EXPECT_NE(r.find("HTTP/1.1 503"), std::string::npos) << r;
}

TEST(HttpServer, StopAbortsRunningProducers) {
  std::atomic<int> aborts{0};
  auto server = std::make_unique<HttpServer>(quick_options(), [&](HttpRequest&) {
    return HandlerResult{{}, std::make_unique<TickerProducer>(100000, 0, &aborts)};
  });
  server->start();
  Client c(server->port());
  c.send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n");
  (void)c.read_until([](const std::string& b) { return b.find("data: 2\n") != std::string::npos; });
  server->stop();
  EXPECT_EQ(aborts.load(), 1);
  EXPECT_TRUE(c.wait_closed(2000ms));
  server.reset();
}

// `basalt serve`'s drain: stop_accepting() at the signal, stop() soon after.
// Both close the listening socket from a handler on the I/O threads; with
// several threads on one context the two handlers must not run at once (a
// concurrent close of one acceptor is a data race that crashed the server at
// exit about once in a hundred drains on a loaded machine). Connections keep
// arriving meanwhile, so an accept completes next to the closes too.
TEST(HttpServer, StopAcceptingThenStopWithManyIoThreads) {
  for (int round = 0; round < 200; ++round) {
    HttpServerOptions o = quick_options();
    o.io_threads = 8;
    HttpServer server(o, echo);
    server.start();
    const uint16_t port = server.port();
    std::atomic<bool> done{false};
    std::thread knocker([&] {
      while (!done.load()) Client knock(port);
    });
    Client c(port);
    EXPECT_TRUE(c.connected());  // not ASSERT: the knocker must be joined
    c.send(post("/a", "x"));
    EXPECT_NE(c.response().find("200"), std::string::npos);
    server.stop_accepting();
    server.stop();
    done.store(true);
    knocker.join();
  }
}

TEST(HttpServer, PerThreadIoModelDealsConnectionsRoundTheThreads) {
  HttpServerOptions o = quick_options();
  o.io_threads = 3;
  o.io_model = IoModel::kPerThread;
  std::mutex mu;
  std::map<std::string, std::thread::id> thread_of;  // by connection's probe
  std::atomic<int> aborts{0};
  auto server = std::make_unique<HttpServer>(o, [&](HttpRequest& r) {
    {
      std::lock_guard<std::mutex> lock(mu);
      const std::string probe(r.header("x-probe").value_or(""));
      const auto [it, fresh] = thread_of.emplace(probe, std::this_thread::get_id());
      // A connection stays on its thread.
      EXPECT_TRUE(fresh || it->second == std::this_thread::get_id()) << probe;
    }
    if (r.path == "/plain") return echo(r);
    return HandlerResult{{}, std::make_unique<TickerProducer>(r.path == "/forever" ? 100000 : 20, 0, &aborts)};
  });
  server->start();
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 6; ++i) clients.push_back(std::make_unique<Client>(server->port()));
  // Two requests on each connection: a stream (woken from its producer's
  // thread), then a whole answer on the same connection.
  for (int i = 0; i < 6; ++i) clients[i]->send("GET /stream HTTP/1.1\r\nHost: x\r\nX-Probe: " + std::to_string(i) + "\r\n\r\n");
  for (int i = 0; i < 6; ++i) {
    const std::string raw =
        clients[i]->read_until([](const std::string& b) { return b.find("\r\n0\r\n\r\n") != std::string::npos; });
    EXPECT_NE(raw.find("data: 19\n"), std::string::npos) << i << raw.substr(0, 200);
  }
  for (int i = 0; i < 6; ++i) {
    clients[i]->send("GET /plain HTTP/1.1\r\nHost: x\r\nX-Probe: " + std::to_string(i) + "\r\n\r\n");
    (void)clients[i]->read_until([](const std::string& b) { return b.find("GET /plain") != std::string::npos; });
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(thread_of.size(), 6u);
    std::set<std::thread::id> threads;
    for (const auto& [probe, id] : thread_of) threads.insert(id);
    EXPECT_EQ(threads.size(), 3u);  // six connections dealt round three threads
    // Dealt in turn: connections i and i + 3 share a thread.
    for (int i = 0; i < 3; ++i) EXPECT_EQ(thread_of[std::to_string(i)], thread_of[std::to_string(i + 3)]);
  }
  EXPECT_EQ(server->open_connections(), 6u);
  // stop() reaches every thread's connections.
  clients[4]->send("GET /forever HTTP/1.1\r\nHost: x\r\nX-Probe: 4\r\n\r\n");
  (void)clients[4]->read_until([](const std::string& b) {  // past the answers already read
    return b.find("data: 2\n", b.find("GET /plain")) != std::string::npos;
  });
  server->stop();
  EXPECT_EQ(aborts.load(), 1);
  for (auto& c : clients) EXPECT_TRUE(c->wait_closed(2000ms));
  server.reset();
}

TEST(HttpServer, BindErrorsAreClear) {
  HttpServer a(quick_options(), echo);
  a.start();
  HttpServerOptions o = quick_options();
  o.port = a.port();
  HttpServer b(o, echo);
  try {
    b.start();
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen"), std::string::npos) << e.what();
  }
  HttpServerOptions bad = quick_options();
  bad.host = "not-an-ip";
  HttpServer c(bad, echo);
  EXPECT_THROW(c.start(), std::exception);
}

#ifdef BASALT_TLS
TEST(HttpServer, ServesHttpsWithTheGivenCertificate) {
  HttpServerOptions o = quick_options();
  o.tls_cert_file = std::string(BASALT_TESTDATA) + "/tls/cert.pem";
  o.tls_key_file = std::string(BASALT_TESTDATA) + "/tls/key.pem";
  HttpServer server(o, echo);
  server.start();
  namespace asio = boost::asio;
  asio::io_context ioc;
  asio::ssl::context ctx(asio::ssl::context::tls_client);
  ctx.set_verify_mode(asio::ssl::verify_none);
  asio::ssl::stream<asio::ip::tcp::socket> s(ioc, ctx);
  s.next_layer().connect({asio::ip::make_address("127.0.0.1"), server.port()});
  s.handshake(asio::ssl::stream_base::client);
  const std::string req = post("/secure", "s", "Connection: close\r\n");
  asio::write(s, asio::buffer(req));
  std::string got;
  boost::system::error_code ec;
  char buf[1024];
  for (;;) {
    const size_t n = s.read_some(asio::buffer(buf), ec);
    got.append(buf, n);
    if (ec) break;
  }
  EXPECT_NE(got.find("POST /secure s"), std::string::npos) << got;
  // A plain-text client gets nothing useful and the server survives it.
  Client plain(server.port());
  plain.send(post("/", "x"));
  EXPECT_TRUE(plain.wait_closed(3000ms));
}

TEST(HttpServer, MissingTlsFilesAreClearErrors) {
  HttpServerOptions o = quick_options();
  o.tls_cert_file = "/nonexistent/cert.pem";
  o.tls_key_file = "/nonexistent/key.pem";
  HttpServer server(o, echo);
  try {
    server.start();
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("TLS certificate"), std::string::npos) << e.what();
  }
}
#endif

}  // namespace
}  // namespace basalt

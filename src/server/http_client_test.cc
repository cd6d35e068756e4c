// HttpClient against the real HttpServer on a free port: head, data as it
// is produced, keep-alive reuse, cancel (the server sees the client go),
// timeouts, refused connections, body limits, a server that closes idle
// connections, calls from other threads, and a client destroyed mid-flight.
#include "server/http_client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "server/http_server.h"

namespace basalt {
namespace {

using namespace std::chrono_literals;

// Streams `pieces`, each once `gate(i)` says so (polled at each wake-up);
// never ends when `forever`.
class PiecesProducer : public ResponseProducer {
 public:
  PiecesProducer(std::vector<std::string> pieces, std::function<bool(size_t)> gate, bool forever,
                 std::atomic<int>* aborts)
      : pieces_(std::move(pieces)), gate_(std::move(gate)), forever_(forever), aborts_(aborts) {}
  void start(std::function<void()> wake) override {
    wake_ = std::move(wake);
    ticker_ = std::thread([this] {
      while (!stop_) {
        std::this_thread::sleep_for(2ms);
        wake_();
      }
    });
  }
  void pull(Output& out) override {
    if (!head_sent_) {
      HttpResponse head;
      head.content_type = "text/event-stream";
      head.headers.emplace_back("X-Piece-Count", std::to_string(pieces_.size()));
      out.head = head;
      head_sent_ = true;
    }
    while (next_ < pieces_.size() && (!gate_ || gate_(next_))) out.data += pieces_[next_++];
    if (next_ == pieces_.size() && !forever_) out.done = true;
  }
  void abort() override {
    if (aborts_) ++*aborts_;
  }
  ~PiecesProducer() override {
    stop_ = true;
    ticker_.join();
  }

 private:
  std::vector<std::string> pieces_;
  std::function<bool(size_t)> gate_;
  bool forever_;
  std::atomic<int>* aborts_;
  std::function<void()> wake_;
  std::thread ticker_;
  std::atomic<bool> stop_{false};
  bool head_sent_ = false;
  size_t next_ = 0;
};

struct Outcome {
  std::optional<IncomingHead> head;
  std::string data;
  std::vector<std::string> pieces;
  int done_calls = 0;
  HttpFailure failure = HttpFailure::kNone;
  std::string message;
};

ExchangeCallbacks record(Outcome& o) {
  ExchangeCallbacks c;
  c.on_head = [&o](const IncomingHead& h) { o.head = h; };
  c.on_data = [&o](std::string_view d) {
    o.data += d;
    o.pieces.emplace_back(d);
  };
  c.on_done = [&o](HttpFailure f, const std::string& m) {
    ++o.done_calls;
    o.failure = f;
    o.message = m;
  };
  return c;
}

class ClientAgainstServer : public ::testing::Test {
 protected:
  void serve(HttpHandler handler, HttpServerOptions options = {}) {
    options.port = 0;
    server_ = std::make_unique<HttpServer>(options, std::move(handler));
    server_->start();
  }
  std::string base() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  // Runs the io_context until `o` is done (or 10 s pass).
  void run_until_done(boost::asio::io_context& io, const Outcome& o) {
    const auto until = std::chrono::steady_clock::now() + 10s;
    io.restart();
    while (o.done_calls == 0 && std::chrono::steady_clock::now() < until) io.run_for(5ms);
  }
  std::unique_ptr<HttpServer> server_;
};

HandlerResult echo(HttpRequest& r) {
  HandlerResult out;
  if (r.path.ends_with("/missing")) {
    out.response.status = 404;
    out.response.body = R"({"error":"no such thing"})";
    return out;
  }
  out.response.body = r.method + " " + r.target + " " + r.body + " " +
                      std::string(r.header("x-test").value_or("-")) + " " +
                      std::string(r.header("user-agent").value_or("-"));
  return out;
}

TEST_F(ClientAgainstServer, AnswersWholeAndKeepsTheConnection) {
  serve(echo);
  boost::asio::io_context io;
  HttpClient client(io, parse_base_url(base() + "/api"));
  for (const char* path : {"/one?x=1", "/missing", "/two"}) {
    Outcome o;
    OutgoingRequest req;
    req.method = "POST";
    req.path = path;
    req.body = "hello";
    req.headers.emplace_back("X-Test", "yes");
    client.send(req, record(o));
    run_until_done(io, o);
    ASSERT_EQ(o.done_calls, 1) << path;
    EXPECT_EQ(o.failure, HttpFailure::kNone) << o.message;
    ASSERT_TRUE(o.head.has_value());
    if (std::string(path) == "/missing") {
      EXPECT_EQ(o.head->status, 404);  // a status is not a failure of the exchange
      EXPECT_NE(o.data.find("no such thing"), std::string::npos);
    } else {
      EXPECT_EQ(o.head->status, 200);
      EXPECT_EQ(o.head->header("content-type").value_or(""), "application/json");
      EXPECT_EQ(o.data, "POST /api" + std::string(path) + " hello yes basalt");
    }
  }
  EXPECT_EQ(client.connections_opened(), 1u);
}

TEST_F(ClientAgainstServer, DeliversDataAsItIsProduced) {
  // The second piece is produced only after the client has received the
  // first: a client that delivered at the end would never get there.
  std::atomic<bool> first_arrived{false};
  serve([&](HttpRequest&) {
    HandlerResult out;
    out.producer = std::make_unique<PiecesProducer>(
        std::vector<std::string>{"data: 1\n\n", "data: 2\n\n"}, [&](size_t i) { return i == 0 || first_arrived.load(); },
        false, nullptr);
    return out;
  });
  boost::asio::io_context io;
  HttpClient client(io, parse_base_url(base()));
  Outcome o;
  ExchangeCallbacks c = record(o);
  c.on_data = [&](std::string_view d) {
    o.data += d;
    o.pieces.emplace_back(d);
    first_arrived = true;
  };
  client.send({"GET", "/stream", {}, ""}, c);
  run_until_done(io, o);
  ASSERT_EQ(o.done_calls, 1);
  EXPECT_EQ(o.failure, HttpFailure::kNone) << o.message;
  EXPECT_EQ(o.data, "data: 1\n\ndata: 2\n\n");
  EXPECT_GE(o.pieces.size(), 2u);
  ASSERT_TRUE(o.head.has_value());
  EXPECT_EQ(o.head->header("x-piece-count").value_or(""), "2");
  EXPECT_EQ(o.head->header("content-type").value_or(""), "text/event-stream");
}

TEST_F(ClientAgainstServer, CancelEndsTheExchangeAndTheServerSeesTheClientGo) {
  std::atomic<int> aborts{0};
  serve([&](HttpRequest&) {
    HandlerResult out;
    out.producer = std::make_unique<PiecesProducer>(std::vector<std::string>{"data: x\n\n"}, nullptr, true, &aborts);
    return out;
  });
  boost::asio::io_context io;
  HttpClient client(io, parse_base_url(base()));
  Outcome o;
  ExchangeHandle handle;
  ExchangeCallbacks c = record(o);
  c.on_data = [&](std::string_view d) {
    o.data += d;
    handle.cancel();  // from inside a callback
    handle.cancel();  // twice: harmless
  };
  handle = client.send({"GET", "/forever", {}, ""}, c);
  run_until_done(io, o);
  EXPECT_EQ(o.done_calls, 1);
  EXPECT_EQ(o.failure, HttpFailure::kCancelled);
  EXPECT_EQ(o.data, "data: x\n\n");
  handle.cancel();  // after the end: harmless
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (aborts.load() == 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(aborts.load(), 1);
}

TEST_F(ClientAgainstServer, TimesOutRefusesAndLimits) {
  serve([&](HttpRequest& r) {
    HandlerResult out;
    if (r.path == "/big") {
      out.response.body = std::string(4096, 'x');
      return out;
    }
    // Never produces anything.
    out.producer = std::make_unique<PiecesProducer>(std::vector<std::string>{}, [](size_t) { return false; }, true,
                                                    nullptr);
    return out;
  });
  boost::asio::io_context io;
  HttpClientOptions options;
  options.timeout_s = 0.3;
  options.max_body_bytes = 1000;
  HttpClient client(io, parse_base_url(base()), options);
  Outcome slow, big;
  client.send({"GET", "/slow", {}, ""}, record(slow));
  run_until_done(io, slow);
  EXPECT_EQ(slow.failure, HttpFailure::kTimeout) << slow.message;
  EXPECT_EQ(slow.done_calls, 1);
  client.send({"GET", "/big", {}, ""}, record(big));
  run_until_done(io, big);
  EXPECT_EQ(big.failure, HttpFailure::kBroken) << big.message;

  int port = 0;
  {
    HttpServerOptions o;
    o.port = 0;
    HttpServer gone(o, echo);
    gone.start();
    port = gone.port();
  }
  HttpClient refused(io, parse_base_url("http://127.0.0.1:" + std::to_string(port)));
  Outcome r;
  refused.send({"GET", "/", {}, ""}, record(r));
  run_until_done(io, r);
  EXPECT_EQ(r.failure, HttpFailure::kConnect) << r.message;
  EXPECT_FALSE(r.head.has_value());
}

TEST_F(ClientAgainstServer, RetriesOnceWhereTheServerClosedAnIdleConnection) {
  HttpServerOptions options;
  options.idle_timeout = 100ms;
  serve(echo, options);
  boost::asio::io_context io;
  HttpClient client(io, parse_base_url(base()));
  for (int i = 0; i < 2; ++i) {
    Outcome o;
    client.send({"GET", "/x", {}, ""}, record(o));
    run_until_done(io, o);
    EXPECT_EQ(o.failure, HttpFailure::kNone) << o.message;
    std::this_thread::sleep_for(300ms);  // the server closes the kept connection
  }
  EXPECT_EQ(client.connections_opened(), 2u);
}

TEST_F(ClientAgainstServer, SendsFromOtherThreadsAndSerializesCallbacks) {
  serve(echo);
  boost::asio::io_context io;
  auto guard = boost::asio::make_work_guard(io);
  std::vector<std::thread> runners;
  for (int i = 0; i < 3; ++i) runners.emplace_back([&] { io.run(); });
  HttpClient client(io, parse_base_url(base()));
  std::atomic<int> inside{0}, overlaps{0}, ok{0}, done{0};
  const auto enter = [&] {
    if (inside.fetch_add(1) != 0) ++overlaps;
    std::this_thread::sleep_for(50us);
    --inside;
  };
  std::vector<std::thread> senders;
  for (int t = 0; t < 4; ++t)
    senders.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        ExchangeCallbacks c;
        c.on_head = [&](const IncomingHead&) { enter(); };
        c.on_data = [&](std::string_view) { enter(); };
        c.on_done = [&](HttpFailure f, const std::string&) {
          enter();
          if (f == HttpFailure::kNone) ++ok;
          ++done;
        };
        client.send({"GET", "/t" + std::to_string(t) + "/" + std::to_string(i), {}, ""}, c);
      }
    });
  for (std::thread& s : senders) s.join();
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (done.load() < 40 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  guard.reset();
  io.stop();
  for (std::thread& r : runners) r.join();
  EXPECT_EQ(done.load(), 40);
  EXPECT_EQ(ok.load(), 40);
  EXPECT_EQ(overlaps.load(), 0);
}

TEST_F(ClientAgainstServer, AnExchangeOutlivesItsClient) {
  serve(echo);
  boost::asio::io_context io;
  Outcome o;
  {
    HttpClient client(io, parse_base_url(base()));
    client.send({"GET", "/late", {}, ""}, record(o));
  }
  run_until_done(io, o);
  EXPECT_EQ(o.done_calls, 1);
  EXPECT_EQ(o.failure, HttpFailure::kNone) << o.message;
  EXPECT_NE(o.data.find("/late"), std::string::npos);
}

TEST(ParseBaseUrl, NamesWhatItValidates) {
  const BaseUrl u = parse_base_url("http://[::1]:9000/x/", "--replica");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.prefix, "/x");
  try {
    parse_base_url("ftp://h", "--replica");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--replica"), std::string::npos) << e.what();
  }
  EXPECT_STREQ(http_failure_name(HttpFailure::kCancelled), "cancelled");
}

}  // namespace
}  // namespace basalt

// The gateway's forwarding (RouteServer over ProxyProducer) against fake
// replicas: HttpServers on free ports whose handlers answer as a replica
// would, or fail as one does. A real HttpServer runs the gateway, and an
// HttpClient is its client, so every byte crosses real sockets.
#include "router/route_server.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/log.h"
#include "router/replica_registry.h"
#include "router/trace_context.h"
#include "server/http_client.h"
#include "server/http_server.h"

namespace basalt::router {
namespace {

using namespace std::chrono_literals;

// A replica's event stream: `events` at once, then `done`, or held open
// until the replica's server stops (`forever`). Counts its aborts.
class EventsProducer : public ResponseProducer {
 public:
  EventsProducer(std::string events, bool forever, std::atomic<int>& aborts)
      : events_(std::move(events)), forever_(forever), aborts_(aborts) {}
  void start(std::function<void()> wake) override { wake(); }
  void pull(Output& out) override {
    if (sent_) return;
    HttpResponse head;
    head.content_type = "text/event-stream";
    head.headers.emplace_back("X-Request-Id", "replica-id");
    out.head = head;
    out.data = events_;
    out.done = !forever_;
    sent_ = true;
  }
  void abort() override { ++aborts_; }

 private:
  std::string events_;
  bool forever_;
  std::atomic<int>& aborts_;
  bool sent_ = false;
};

// A fake replica: answers each forwarded request as `answer` says, and
// records what it got.
struct FakeReplica {
  std::function<HandlerResult(HttpRequest&)> answer;
  std::unique_ptr<HttpServer> server;
  std::mutex mu;
  std::vector<HttpRequest> got;
  std::atomic<int> aborts{0};

  void start() {
    HttpServerOptions options;
    options.port = 0;
    server = std::make_unique<HttpServer>(options, [this](HttpRequest& r) {
      {
        std::lock_guard<std::mutex> lock(mu);
        got.push_back(r);
      }
      return answer(r);
    });
    server->start();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server->port()); }
  size_t requests() {
    std::lock_guard<std::mutex> lock(mu);
    return got.size();
  }
};

HandlerResult whole(int status, std::string body) {
  HandlerResult r;
  r.response.status = status;
  r.response.body = std::move(body);
  return r;
}

// Waits until every listed replica has a scrape that says `waiting`.
bool scraped(ReplicaRegistry& registry, const std::vector<double>& waiting);

// Log lines go to a file while one lives.
struct LogToFile {
  std::FILE* file = std::tmpfile();
  LogToFile() { set_log_sink(file); }
  ~LogToFile() {
    set_log_sink(nullptr);
    std::fclose(file);
  }
  // The first line that has `needle` ("" when none).
  std::string line_with(const std::string& needle) {
    std::fflush(file);
    std::rewind(file);
    char buffer[4096];
    while (std::fgets(buffer, sizeof buffer, file) != nullptr) {
      const std::string line = buffer;
      if (line.find(needle) != std::string::npos) return line;
    }
    return "";
  }
};

struct Reply {
  std::optional<IncomingHead> head;
  std::string body;
  HttpFailure failure = HttpFailure::kNone;
  bool done = false;
};

class Gateway : public ::testing::Test {
 protected:
  void SetUp() override {
    work_.emplace(boost::asio::make_work_guard(io_));
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    if (server_) server_->stop();
    route_.reset();
    for (auto& r : replicas_)
      if (r->server) r->server->stop();
    work_.reset();
    io_.stop();
    thread_.join();
  }
  // A replica that streams `events`, then ends, or holds the stream open
  // (`forever`); its aborts count in `aborts`, else in its own counter.
  FakeReplica& streaming(std::string events, bool forever, std::atomic<int>* aborts = nullptr) {
    replicas_.push_back(std::make_unique<FakeReplica>());
    FakeReplica& f = *replicas_.back();
    std::atomic<int>& counter = aborts != nullptr ? *aborts : f.aborts;
    f.answer = [events = std::move(events), forever, &counter](HttpRequest&) {
      HandlerResult r;
      r.producer = std::make_unique<EventsProducer>(events, forever, counter);
      return r;
    };
    f.start();
    return f;
  }
  // A replica that answers {"from":"NAME"}.
  FakeReplica& named(const std::string& name) {
    return replica([body = R"({"from":")" + name + "\"}"](HttpRequest&) { return whole(200, body); });
  }
  // A replica whose /metrics says `waiting` requests wait in it, and which
  // answers anything else {"from":"NAME","usage":...}.
  FakeReplica& metered(const std::string& name, std::shared_ptr<std::atomic<int>> waiting) {
    return replica([name, waiting](HttpRequest& r) {
      if (r.path == "/metrics")
        return whole(200, "basalt_requests_waiting " + std::to_string(waiting->load()) +
                              "\nbasalt_requests_running 1\nbasalt_kv_cache_usage_ratio 0.1\n");
      return whole(200, R"({"from":")" + name + R"(","usage":{"completion_tokens":1}})");
    });
  }
  FakeReplica& replica(std::function<HandlerResult(HttpRequest&)> answer) {
    replicas_.push_back(std::make_unique<FakeReplica>());
    replicas_.back()->answer = std::move(answer);
    replicas_.back()->start();
    return *replicas_.back();
  }
  // The gateway over `lines` (each "URL [labels]").
  void start_gateway(const std::vector<std::string>& lines, RouteServerOptions options = {}) {
    std::vector<ReplicaSpec> specs;
    for (const std::string& line : lines) specs.push_back(parse_replica(line, "test"));
    registry_.set(std::move(specs));
    options.log_requests = log_requests_;
    options.health_checks = health_checks_;
    options.scrape_metrics = scrape_metrics_;
    route_ = std::make_unique<RouteServer>(registry_, io_, options);
    HttpServerOptions http;
    http.port = 0;
    server_ = std::make_unique<HttpServer>(http, [this](HttpRequest& r) { return route_->handle(r); });
    server_->start();
    client_ = std::make_unique<HttpClient>(io_, parse_base_url("http://127.0.0.1:" + std::to_string(server_->port())));
  }
  // The gateway over `lines`, scraping the replicas' /metrics every 20 ms;
  // true once every replica's scrape says `waiting` (in the order listed).
  bool start_scraping_gateway(const std::vector<std::string>& lines, RouteServerOptions options,
                              const std::vector<double>& waiting) {
    scrape_metrics_ = true;
    options.scrape.interval = 20ms;
    start_gateway(lines, options);
    return scraped(registry_, waiting);
  }
  // One request through the gateway, to its end.
  Reply call(const std::string& method, const std::string& path, const std::string& body = {},
             std::vector<std::pair<std::string, std::string>> headers = {}) {
    auto reply = std::make_shared<Reply>();
    auto mu = std::make_shared<std::mutex>();
    auto cv = std::make_shared<std::condition_variable>();
    OutgoingRequest req;
    req.method = method;
    req.path = path;
    req.body = body;
    req.headers = std::move(headers);
    ExchangeCallbacks c;
    c.on_head = [reply, mu](const IncomingHead& h) {
      std::lock_guard<std::mutex> lock(*mu);
      reply->head = h;
    };
    c.on_data = [reply, mu](std::string_view d) {
      std::lock_guard<std::mutex> lock(*mu);
      reply->body.append(d);
    };
    c.on_done = [reply, mu, cv](HttpFailure f, const std::string&) {
      std::lock_guard<std::mutex> lock(*mu);
      reply->failure = f;
      reply->done = true;
      cv->notify_all();
    };
    client_->send(req, c);
    std::unique_lock<std::mutex> lock(*mu);
    EXPECT_TRUE(cv->wait_for(lock, 10s, [&] { return reply->done; })) << method << " " << path;
    return *reply;
  }
  std::string metrics() { return call("GET", "/metrics").body; }
  std::string metrics_as(const std::string& key) {
    return call("GET", "/metrics", {}, {{"Authorization", "Bearer " + key}}).body;
  }

  bool log_requests_ = false;
  bool health_checks_ = false;  // the probes would count as requests the fakes got
  bool scrape_metrics_ = false;  // so would the scrapes
  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::thread thread_;
  std::vector<std::unique_ptr<FakeReplica>> replicas_;
  ReplicaRegistry registry_;
  std::unique_ptr<RouteServer> route_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<HttpClient> client_;
};

const std::string kCompletion = R"({"model":"m","prompt":"hi"})";

TEST_F(Gateway, PassesAWholeAnswerOnWithItsStatusAndHeaders) {
  FakeReplica& a = replica([](HttpRequest& r) {
    HandlerResult out = whole(200, R"({"echo":)" + r.body + "}");
    out.response.headers.emplace_back("X-Request-Id", std::string(r.header("x-request-id").value_or("none")));
    return out;
  });
  RouteServerOptions options;
  options.api_keys = {"k1"};
  options.upstream_api_key = "up";
  start_gateway({a.url()}, options);
  const Reply r = call("POST", "/v1/completions?x=1", kCompletion,
                       {{"Authorization", "Bearer k1"}, {"X-Request-Id", "client-7"},
                        {"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}});
  ASSERT_TRUE(r.head);
  EXPECT_EQ(r.head->status, 200);
  EXPECT_EQ(r.head->header("x-request-id").value_or(""), "client-7");
  ASSERT_EQ(a.requests(), 1u);
  const HttpRequest got = a.got[0];  // a copy: the list grows below
  EXPECT_EQ(got.target, "/v1/completions?x=1");
  // The body as sent, with a seed of the gateway's (none was given), so
  // that an attempt run again draws the same.
  nlohmann::json sent = nlohmann::json::parse(got.body);
  ASSERT_TRUE(sent["seed"].is_number_integer()) << got.body;
  EXPECT_GE(sent["seed"].get<int64_t>(), 0);
  sent.erase("seed");
  EXPECT_EQ(sent, nlohmann::json::parse(kCompletion));
  EXPECT_EQ(r.body, R"({"echo":)" + got.body + "}");
  // A body with a seed goes on byte for byte; without an X-Request-Id the
  // gateway names the request.
  const std::string seeded = R"({"prompt":"hi", "seed":5,"model":"m"})";
  call("POST", "/v1/completions", seeded, {{"Authorization", "Bearer k1"}});
  ASSERT_EQ(a.requests(), 2u);
  EXPECT_EQ(a.got[1].body, seeded);
  EXPECT_EQ(a.got[1].header("x-request-id").value_or("").rfind("route-", 0), 0u);
  // The replica gets the gateway's key, never the client's.
  EXPECT_EQ(got.header("authorization").value_or(""), "Bearer up");
  // The client's trace, under a parent-id of the gateway's attempt.
  const std::string traceparent(got.header("traceparent").value_or(""));
  EXPECT_EQ(traceparent.substr(0, 36), "00-0af7651916cd43dd8448eb211c80319c-") << traceparent;
  EXPECT_NE(traceparent.substr(36, 16), "b7ad6b7169203331") << traceparent;
  // Without the key: 401, and nothing forwarded.
  EXPECT_EQ(call("POST", "/v1/completions", kCompletion).head->status, 401);
  EXPECT_EQ(a.requests(), 2u);
}

TEST_F(Gateway, SpreadsRequestsRoundRobinAndRoutesByModel) {
  FakeReplica& a = named("a");
  FakeReplica& b = named("b");
  FakeReplica& c = named("c");
  RouteServerOptions options;
  options.policy = Policy::kRoundRobin;
  start_gateway({a.url(), b.url(), c.url() + " model=other"}, options);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(call("POST", "/v1/completions", kCompletion).head->status, 200);
  // Model m: a and b (c serves only "other"), three each.
  EXPECT_EQ(a.requests(), 3u);
  EXPECT_EQ(b.requests(), 3u);
  EXPECT_EQ(c.requests(), 0u);
  // "other" is served by c and by the unlabeled a and b.
  for (int i = 0; i < 3; ++i) call("POST", "/v1/chat/completions", R"({"model":"other","messages":[]})");
  EXPECT_EQ(c.requests(), 1u);
  EXPECT_EQ(a.requests() + b.requests(), 8u);
}

TEST_F(Gateway, AnswersWhatItCanWithoutAReplica) {
  FakeReplica& a = replica([](HttpRequest&) { return whole(200, "{}"); });
  start_gateway({a.url() + " model=m"});
  EXPECT_EQ(call("GET", "/health").head->status, 200);
  EXPECT_EQ(call("GET", "/ready").head->status, 200);
  const Reply bad = call("POST", "/v1/completions", "{not json");
  EXPECT_EQ(bad.head->status, 400);
  EXPECT_NE(bad.body.find("\"error\""), std::string::npos);
  const Reply unknown = call("POST", "/v1/completions", R"({"model":"nope","prompt":"x"})");
  EXPECT_EQ(unknown.head->status, 404);
  EXPECT_NE(unknown.body.find("nope"), std::string::npos);
  EXPECT_EQ(call("GET", "/v1/completions").head->status, 405);
  EXPECT_EQ(call("GET", "/nowhere").head->status, 404);
  EXPECT_EQ(a.requests(), 0u);
  // GET endpoints go to any replica.
  EXPECT_EQ(call("GET", "/v1/models").head->status, 200);
  EXPECT_EQ(a.requests(), 1u);
}

TEST_F(Gateway, RetriesOnAnotherReplicaBeforeTheFirstByte) {
  FakeReplica& busy = replica([](HttpRequest&) {
    HandlerResult r = whole(503, R"({"error":{"message":"draining"}})");
    r.response.headers.emplace_back("Retry-After", "2");
    return r;
  });
  FakeReplica& ok = replica([](HttpRequest&) { return whole(200, R"({"ok":true})"); });
  FakeReplica& refused = replica([](HttpRequest&) { return whole(200, "{}"); });
  const std::string refused_url = refused.url();
  refused.server->stop();  // nothing listens there any more
  start_gateway({busy.url(), refused_url, ok.url()});
  for (int i = 0; i < 6; ++i) {
    const Reply r = call("POST", "/v1/completions", kCompletion);
    ASSERT_TRUE(r.head);
    EXPECT_EQ(r.head->status, 200) << i;
    EXPECT_EQ(r.body, R"({"ok":true})");
  }
  EXPECT_EQ(ok.requests(), 6u);
  const std::string m = metrics();
  EXPECT_NE(m.find("outcome=\"unavailable\""), std::string::npos) << m;
  EXPECT_NE(m.find("outcome=\"unreachable\""), std::string::npos) << m;
  // The replica that refused was ejected at once, and tried only once.
  const std::string refused_id = canonical_url(parse_base_url(refused_url));
  EXPECT_NE(m.find("basalt_route_replica_attempts_total{replica=\"" + refused_id + "\",outcome=\"unreachable\"} 1"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("basalt_route_replica_breaker_state{replica=\"" + refused_id + "\"} 2"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_replica_in_flight{replica=")" + canonical_url(parse_base_url(ok.url())) + "\"} 0"),
            std::string::npos)
      << m;
}

TEST_F(Gateway, PassesTheLastRetryableAnswerOnWhenNoReplicaIsLeft) {
  FakeReplica& a = replica([](HttpRequest&) {
    HandlerResult r = whole(429, R"({"error":{"message":"queue full"}})");
    r.response.headers.emplace_back("Retry-After", "3");
    return r;
  });
  FakeReplica& b = replica([](HttpRequest&) { return whole(503, R"({"error":{"message":"busy"}})"); });
  start_gateway({a.url(), b.url()});
  const Reply r = call("POST", "/v1/completions", kCompletion);
  ASSERT_TRUE(r.head);
  EXPECT_TRUE(r.head->status == 429 || r.head->status == 503) << r.head->status;
  EXPECT_EQ(a.requests() + b.requests(), 2u);  // each tried once
  // A request's own error is not retried.
  FakeReplica& c = replica([](HttpRequest&) { return whole(400, R"({"error":{"message":"bad"}})"); });
  start_gateway({c.url(), a.url()});
  const size_t a_before = a.requests();
  const Reply bad = call("POST", "/v1/completions", kCompletion);
  EXPECT_EQ(bad.head->status, 400);
  EXPECT_EQ(bad.body, R"({"error":{"message":"bad"}})");
  EXPECT_EQ(c.requests(), 1u);
  EXPECT_EQ(a.requests(), a_before);
}

TEST_F(Gateway, AllReplicasDownIs502) {
  FakeReplica& a = replica([](HttpRequest&) { return whole(200, "{}"); });
  const std::string url = a.url();
  a.server->stop();
  start_gateway({url});
  const Reply r = call("POST", "/v1/completions", kCompletion);
  EXPECT_EQ(r.head->status, 502);
  EXPECT_NE(r.body.find("replicas failed"), std::string::npos) << r.body;
}

TEST_F(Gateway, PassesAStreamOnEventByEventWithoutComments) {
  const std::string events = "data: {\"i\":1}\n\n: hb\n\ndata: {\"i\":2}\r\n\r\ndata: [DONE]\n\n";
  FakeReplica& a = streaming(events, false);
  start_gateway({a.url()});
  const Reply r = call("POST", "/v1/chat/completions", R"({"model":"m","stream":true,"messages":[]})");
  ASSERT_TRUE(r.head);
  EXPECT_EQ(r.head->status, 200);
  EXPECT_EQ(r.head->header("content-type").value_or(""), "text/event-stream");
  EXPECT_EQ(r.head->header("x-request-id").value_or(""), "replica-id");
  EXPECT_EQ(r.body, "data: {\"i\":1}\n\ndata: {\"i\":2}\r\n\r\ndata: [DONE]\n\n");
}

TEST_F(Gateway, AStreamWhoseReplicaDiesEndsWithAnErrorEvent) {
  FakeReplica& a = streaming("data: {\"i\":1}\n\ndata: {\"i\":2}\n\n", true);
  start_gateway({a.url()});
  std::thread killer([&] {
    while (a.requests() == 0) std::this_thread::sleep_for(5ms);
    std::this_thread::sleep_for(100ms);  // the two events are on their way
    a.server->stop();
  });
  const Reply r = call("POST", "/v1/completions", R"({"model":"m","stream":true,"prompt":"x"})");
  killer.join();
  ASSERT_TRUE(r.head);
  EXPECT_EQ(r.head->status, 200);
  EXPECT_EQ(r.failure, HttpFailure::kNone);
  EXPECT_EQ(r.body.rfind("data: {\"i\":1}\n\ndata: {\"i\":2}\n\ndata: {\"error\":", 0), 0u) << r.body;
  EXPECT_NE(r.body.find("\"code\":\"upstream_failed\""), std::string::npos) << r.body;
  EXPECT_TRUE(r.body.ends_with("data: [DONE]\n\n")) << r.body;
}

TEST_F(Gateway, AClientThatGoesAwayCancelsItsReplicaRequest) {
  FakeReplica& a = streaming("data: {\"i\":1}\n\n", true);
  start_gateway({a.url()});
  std::atomic<bool> got_event{false};
  OutgoingRequest req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = R"({"model":"m","stream":true,"prompt":"x"})";
  ExchangeCallbacks c;
  c.on_data = [&](std::string_view) { got_event = true; };
  const ExchangeHandle h = client_->send(req, c);
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!got_event && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(got_event);
  // A stream that has begun answering is running at its replica: sent since
  // the (absent) scrape, but no longer counted as waiting there.
  ReplicaState& state = *registry_.snapshot()->replicas[0].state;
  const auto counts = [&state] {
    std::lock_guard<std::mutex> lock(state.mu);
    return std::make_pair(state.sent_since_scrape, state.unanswered_since_scrape);
  };
  EXPECT_EQ(counts(), std::make_pair(int64_t{1}, int64_t{0}));
  h.cancel();
  while (a.aborts.load() == 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(a.aborts.load(), 1);
  // And its attempt no longer counts as in flight, nor the request.
  const std::string needle =
      R"(basalt_route_replica_in_flight{replica=")" + canonical_url(parse_base_url(a.url())) + "\"} 0";
  while (metrics().find(needle) == std::string::npos && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(5ms);
  const std::string m = metrics();
  EXPECT_NE(m.find(needle), std::string::npos) << m;
  EXPECT_NE(m.find("basalt_route_requests_in_flight 0"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_requests_total{route="/v1/completions",status="499"} 1)"), std::string::npos) << m;
  EXPECT_EQ(counts(), std::make_pair(int64_t{0}, int64_t{0}));
}


// Mid-stream failover: replica `a` writes two choices' worth of events with
// their resume comments, the last one cut short; replica `b` continues from
// what the client got.
class Failover : public Gateway {
 protected:
  static constexpr const char* kFirst =
      ": basalt {\"i\":0,\"t\":[1,2],\"o\":5,\"f\":0}\n"
      "data: {\"created\":123,\"choices\":[{\"index\":0,\"text\":\"hello\"}]}\n\n"
      ": hb\n\n"
      ": basalt {\"i\":1,\"t\":[7],\"o\":3,\"f\":1}\n"
      "data: {\"choices\":[{\"index\":1,\"text\":\"abc\",\"finish_reason\":\"stop\"}]}\n\n"
      ": basalt {\"i\":0,\"t\":[3],\"o\":9,\"f\":0}\n"
      "data: {\"choices\":[{\"index\":0,\"text\":\" wor";  // cut short: never passed on
  static constexpr const char* kRest = "data: {\"choices\":[{\"index\":0,\"text\":\" world\"}]}\n\ndata: [DONE]\n\n";
  static constexpr const char* kClientSees =
      "data: {\"created\":123,\"choices\":[{\"index\":0,\"text\":\"hello\"}]}\n\n"
      "data: {\"choices\":[{\"index\":1,\"text\":\"abc\",\"finish_reason\":\"stop\"}]}\n\n"
      "data: {\"choices\":[{\"index\":0,\"text\":\" world\"}]}\n\ndata: [DONE]\n\n";

  FakeReplica& continuing() { return streaming(kRest, false, &aborts_); }
  // What `b` must have been asked: the same body and seed, plus what the
  // client has of each choice.
  static void expect_resumed(const HttpRequest& got) {
    const nlohmann::json body = nlohmann::json::parse(got.body);
    EXPECT_EQ(body["seed"], 42);
    EXPECT_EQ(body["prompt"], "x");
    const nlohmann::json expected = nlohmann::json::parse(R"({"choices": [
        {"index": 0, "output_token_ids": [1, 2], "text_offset": 5, "finished": false},
        {"index": 1, "output_token_ids": [7], "text_offset": 3, "finished": true}], "created": 123})");
    EXPECT_EQ(body["basalt_resume"], expected) << got.body;
    EXPECT_EQ(got.header("x-basalt-resume-info").value_or(""), "1");
    EXPECT_EQ(got.header("x-request-id").value_or(""), "same-id");
  }
  Reply stream() {
    return call("POST", "/v1/completions", R"({"model":"m","stream":true,"prompt":"x","n":2,"seed":42})",
                {{"X-Request-Id", "same-id"}});
  }
  std::atomic<int> aborts_{0};
};

TEST_F(Failover, AReplicaThatDiesMidStreamIsResumedElsewhere) {
  FakeReplica& a = streaming(kFirst, true, &aborts_);
  FakeReplica& b = continuing();
  start_gateway({a.url(), b.url()});
  std::thread killer([&] {
    while (a.requests() == 0) std::this_thread::sleep_for(5ms);
    std::this_thread::sleep_for(100ms);
    a.server->stop();
  });
  const Reply r = stream();
  killer.join();
  ASSERT_TRUE(r.head);
  EXPECT_EQ(r.head->status, 200);
  EXPECT_EQ(r.body, kClientSees);
  ASSERT_EQ(b.requests(), 1u);
  expect_resumed(b.got[0]);
  // The first attempt asked for heartbeats and resume comments.
  EXPECT_EQ(a.got[0].header("x-basalt-resume-info").value_or(""), "1");
  EXPECT_EQ(a.got[0].header("x-basalt-heartbeat").value_or(""), "2500");
  EXPECT_NE(metrics().find("basalt_route_failovers_total{replica=\"" + canonical_url(parse_base_url(a.url())) +
                           "\",reason=\"eof\"} 1"),
            std::string::npos)
      << metrics();
}

TEST_F(Failover, AStalledReplicaIsResumedElsewhere) {
  FakeReplica& a = streaming(kFirst, true, &aborts_);  // then silence
  FakeReplica& b = continuing();
  RouteServerOptions options;
  options.stall_timeout = 300ms;
  start_gateway({a.url(), b.url()}, options);
  const Reply r = stream();
  ASSERT_TRUE(r.head);
  EXPECT_EQ(r.body, kClientSees);
  ASSERT_EQ(b.requests(), 1u);
  expect_resumed(b.got[0]);
  // The stalled replica is told its client went (when it notices).
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (aborts_.load() == 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(aborts_.load(), 1);
  EXPECT_NE(metrics().find("reason=\"stall\"} 1"), std::string::npos) << metrics();
}

TEST_F(Failover, AStreamCutByItsServerIsResumedWithoutTheCut) {
  FakeReplica& a = replica([this](HttpRequest&) {
    const std::string first(kFirst);
    const std::string whole_events = first.substr(0, first.rfind(": basalt")) +
                                     "data: {\"error\":{\"message\":\"draining\",\"type\":\"server_error\",\"param\":"
                                     "null,\"code\":\"cut_by_server\"}}\n\ndata: [DONE]\n\n";
    HandlerResult r;
    r.producer = std::make_unique<EventsProducer>(whole_events, false, aborts_);
    return r;
  });
  FakeReplica& b = continuing();
  start_gateway({a.url(), b.url()});
  const Reply r = stream();
  EXPECT_EQ(r.body, kClientSees);
  ASSERT_EQ(b.requests(), 1u);
  expect_resumed(b.got[0]);
}

// A chat of two choices cut before the second had any chunk: the resumed
// attempt is told that choice was never announced (so it sends its role
// delta), and the cached prompt tokens the first attempt's comments named.
TEST_F(Failover, AChoiceWithoutAChunkIsResumedUnannouncedWithTheFirstAttemptsCachedTokens) {
  const std::string first =
      ": basalt {\"i\":0,\"t\":[],\"o\":0,\"f\":0}\n"
      "data: {\"created\":77,\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
      ": basalt {\"i\":0,\"t\":[4,5],\"o\":2,\"f\":0,\"c\":3}\n"
      "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
  FakeReplica& a = streaming(first, true, &aborts_);
  FakeReplica& b = continuing();
  start_gateway({a.url(), b.url()});
  std::thread killer([&] {
    while (a.requests() == 0) std::this_thread::sleep_for(5ms);
    std::this_thread::sleep_for(100ms);
    a.server->stop();
  });
  const Reply r = call("POST", "/v1/chat/completions",
                       R"({"model":"m","stream":true,"messages":[{"role":"user","content":"x"}],"n":2,"seed":9})");
  killer.join();
  ASSERT_TRUE(r.head);
  ASSERT_EQ(b.requests(), 1u);
  const nlohmann::json resume = nlohmann::json::parse(b.got[0].body)["basalt_resume"];
  const nlohmann::json expected = nlohmann::json::parse(R"({"choices": [
      {"index": 0, "output_token_ids": [4, 5], "text_offset": 2, "finished": false},
      {"index": 1, "announced": false}], "created": 77, "prior_usage": {"cached_tokens": 3}})");
  EXPECT_EQ(resume, expected) << b.got[0].body;
  // A completion of two prompts, two samples each, cut before any event:
  // four choices, none announced, no cached tokens known.
  FakeReplica& c = streaming(": hb\n\n", true, &aborts_);
  FakeReplica& d = continuing();
  RouteServerOptions options;
  options.stall_timeout = 300ms;
  start_gateway({c.url(), d.url()}, options);
  call("POST", "/v1/completions", R"({"model":"m","stream":true,"prompt":["x","y"],"n":2,"seed":9})");
  ASSERT_EQ(d.requests(), 1u);
  const nlohmann::json none = nlohmann::json::parse(d.got[0].body)["basalt_resume"];
  EXPECT_EQ(none, nlohmann::json::parse(R"({"choices": [{"index": 0, "announced": false},
      {"index": 1, "announced": false}, {"index": 2, "announced": false}, {"index": 3, "announced": false}]})"))
      << d.got[0].body;
}

TEST_F(Failover, EndsWithAnErrorEventWhenNoFailoverIsLeft) {
  FakeReplica& a = streaming(kFirst, true, &aborts_);
  RouteServerOptions options;
  options.stall_timeout = 200ms;
  start_gateway({a.url()}, options);
  const Reply r = stream();
  EXPECT_EQ(r.body.rfind("data: {\"created\":123", 0), 0u) << r.body;
  EXPECT_NE(r.body.find("\"code\":\"upstream_failed\""), std::string::npos) << r.body;
  EXPECT_TRUE(r.body.ends_with("data: [DONE]\n\n"));
}


TEST_F(Gateway, ReplicasFailingTheirProbesGetNoRequests) {
  FakeReplica& sick = replica([](HttpRequest& r) {
    return r.path == "/ready" ? whole(503, R"({"status":"loading"})") : whole(200, R"({"from":"sick"})");
  });
  FakeReplica& well = replica([](HttpRequest&) { return whole(200, R"({"from":"well"})"); });
  health_checks_ = true;
  RouteServerOptions options;
  options.health.interval = std::chrono::milliseconds(20);
  start_gateway({sick.url(), well.url()}, options);
  const std::string sick_id = canonical_url(parse_base_url(sick.url()));
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (metrics().find("basalt_route_replica_healthy{replica=\"" + sick_id + "\"} 0") == std::string::npos &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(call("POST", "/v1/completions", kCompletion).body, R"({"from":"well"})");
  EXPECT_EQ(call("GET", "/ready").head->status, 200);  // one replica is healthy
}


TEST_F(Gateway, SessionPolicyKeepsASessionOnOneReplica) {
  FakeReplica& a = named("a");
  FakeReplica& b = named("b");
  FakeReplica& c = named("c");
  RouteServerOptions options;
  options.policy = Policy::kSession;
  start_gateway({a.url(), b.url(), c.url()}, options);
  for (const std::string session : {"alice", "bob", "carol"}) {
    const std::string first = call("POST", "/v1/completions", kCompletion, {{"X-Session-Id", session}}).body;
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(call("POST", "/v1/completions", kCompletion, {{"X-Session-Id", session}}).body, first) << session;
    // The body's user names a session too.
    const std::string body = R"({"model":"m","prompt":"x","user":")" + session + "-u\"}";
    const std::string by_user = call("POST", "/v1/completions", body).body;
    for (int i = 0; i < 3; ++i) EXPECT_EQ(call("POST", "/v1/completions", body).body, by_user) << session;
  }
}


TEST_F(Gateway, CacheAwareSendsASharedPrefixWhereItWentBefore) {
  FakeReplica& a = named("a");
  FakeReplica& b = named("b");
  start_gateway({a.url(), b.url()});  // cache-aware is the default
  const std::string system(1000, 's');
  const auto body = [&](const std::string& prefix, int i) {
    return nlohmann::json{{"model", "m"}, {"prompt", prefix + " question " + std::to_string(i)}}.dump();
  };
  const std::string first = call("POST", "/v1/completions", body(system, 0)).body;
  for (int i = 1; i < 6; ++i) EXPECT_EQ(call("POST", "/v1/completions", body(system, i)).body, first) << i;
  // Another prefix has no match anywhere: the least loaded (both idle) in turn.
  const std::string other(1000, 'o');
  std::set<std::string> seen;
  for (int i = 0; i < 4; ++i) seen.insert(call("POST", "/v1/completions", body(std::to_string(i) + other, i)).body);
  EXPECT_EQ(seen.size(), 2u);
  // A tenant's cache_salt is its own namespace: no match for the same text.
  const std::string salted =
      nlohmann::json{{"model", "m"}, {"prompt", system + " question 1"}, {"cache_salt", "t2"}}.dump();
  std::set<std::string> salted_seen;
  for (int i = 0; i < 4; ++i) salted_seen.insert(call("POST", "/v1/completions", salted).body);
  EXPECT_EQ(salted_seen.size(), 1u);  // its own prefix now, kept together too
}


TEST_F(Gateway, TenantsAreKnownByKeyLimitedAndNamespaced) {
  FakeReplica& a = replica([](HttpRequest&) { return whole(200, R"({"ok":true})"); });
  TenantBook book;
  book.set(parse_tenants(R"({"classes": {"gold": {"priority": 3}},
                             "tenants": {"acme": {"keys": ["sk-acme"], "class": "gold",
                                                  "limits": {"rps": 1, "burst": 2}},
                                         "open": {"keys": ["sk-open"], "share_cache": true}}})",
                         "test"));
  RouteServerOptions options;
  options.tenants = &book;
  start_gateway({a.url()}, options);
  const auto as = [](const char* key) {
    return std::vector<std::pair<std::string, std::string>>{{"Authorization", std::string("Bearer ") + key}};
  };
  const std::string body = R"({"model":"m","prompt":"x","cache_salt":"mine"})";
  EXPECT_EQ(call("POST", "/v1/completions", body, as("sk-acme")).head->status, 200);
  // The replica got the tenant's namespace around the client's salt, and its class's priority.
  const nlohmann::json sent = nlohmann::json::parse(a.got.back().body);
  EXPECT_EQ(sent["cache_salt"], "t:acme/mine");
  EXPECT_EQ(sent["priority"], 3);
  // Burst 2: the second passes, the third is 429 with Retry-After.
  EXPECT_EQ(call("POST", "/v1/completions", body, as("sk-acme")).head->status, 200);
  const Reply limited = call("POST", "/v1/completions", body, as("sk-acme"));
  EXPECT_EQ(limited.head->status, 429);
  EXPECT_EQ(limited.head->header("retry-after").value_or(""), "1");
  EXPECT_NE(limited.body.find("rate limit"), std::string::npos);
  // A sharing tenant keeps the client's salt; an unknown key is 401.
  EXPECT_EQ(call("POST", "/v1/completions", body, as("sk-open")).head->status, 200);
  EXPECT_EQ(nlohmann::json::parse(a.got.back().body)["cache_salt"], "mine");
  EXPECT_EQ(call("POST", "/v1/completions", body, as("sk-nobody")).head->status, 401);
  EXPECT_EQ(call("POST", "/v1/completions", body).head->status, 401);
  const std::string m = metrics_as("sk-open");
  EXPECT_NE(m.find(R"(basalt_route_rejections_total{tenant="acme",reason="rate"} 1)"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_tenant_requests_total{tenant="acme",status="200"} 2)"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_tenant_running{tenant="acme"} 0)"), std::string::npos) << m;
}

// The completions a fake replica got (its scrapes aside).
size_t completions(FakeReplica& f) {
  std::lock_guard<std::mutex> lock(f.mu);
  return static_cast<size_t>(std::count_if(f.got.begin(), f.got.end(),
                                           [](const HttpRequest& r) { return r.path == "/v1/completions"; }));
}

bool scraped(ReplicaRegistry& registry, const std::vector<double>& waiting) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < until) {
    const auto snapshot = registry.snapshot();
    bool all = true;
    for (size_t i = 0; i < snapshot->replicas.size(); ++i) {
      ReplicaState& s = *snapshot->replicas[i].state;
      std::lock_guard<std::mutex> lock(s.mu);
      all = all && s.scraped.valid && s.scraped.waiting == waiting[i];
    }
    if (all) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

TEST_F(Gateway, LeastLoadReadsTheReplicasScrapedQueues) {
  const auto busy = std::make_shared<std::atomic<int>>(50);
  const auto idle = std::make_shared<std::atomic<int>>(0);
  FakeReplica& a = metered("a", busy);
  FakeReplica& b = metered("b", idle);
  RouteServerOptions options;
  options.policy = Policy::kLeastLoad;
  ASSERT_TRUE(start_scraping_gateway({a.url(), b.url()}, options, {50, 0}));
  // The gateway has nothing in flight anywhere: only the scrapes tell them apart.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(call("POST", "/v1/completions", kCompletion).body.substr(0, 12), R"({"from":"b",)");
  EXPECT_EQ(completions(a), 0u);
  EXPECT_EQ(completions(b), 4u);
  const std::string m = metrics();
  const std::string a_id = canonical_url(parse_base_url(a.url()));
  EXPECT_NE(m.find(R"(basalt_route_replica_waiting{replica=")" + a_id + "\"} 50"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_replica_kv_usage{replica=")" + a_id + "\"} 0.1"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_replica_scrape_failures_total{replica=")" + a_id + "\"} 0"), std::string::npos) << m;
}

TEST_F(Gateway, TenantsQueueWhileTheReplicaIsSaturated) {
  LogToFile log;
  log_requests_ = true;
  const auto waiting = std::make_shared<std::atomic<int>>(9);  // past 5: saturated
  FakeReplica& a = metered("a", waiting);
  TenantBook book;
  book.set(parse_tenants(R"({"classes": {"live": {"priority": 2, "queue_deadline_ms": 300},
                                         "spare": {"priority": 0, "sheddable": true}},
                             "tenants": {"live": {"keys": ["sk-live"], "class": "live"},
                                         "spare": {"keys": ["sk-spare"], "class": "spare"}}})",
                         "test"));
  RouteServerOptions options;
  options.tenants = &book;
  ASSERT_TRUE(start_scraping_gateway({a.url()}, options, {9}));
  const auto as = [](const char* key) {
    return std::vector<std::pair<std::string, std::string>>{{"Authorization", std::string("Bearer ") + key}};
  };
  // Sheddable: refused at once.
  const auto t0 = std::chrono::steady_clock::now();
  const Reply shed = call("POST", "/v1/completions", kCompletion, as("sk-spare"));
  EXPECT_EQ(shed.head->status, 429);
  EXPECT_EQ(shed.head->header("retry-after").value_or(""), "1");
  EXPECT_NE(shed.body.find("sheddable"), std::string::npos) << shed.body;
  // Interactive: waits its class's deadline, then 429 with Retry-After.
  const Reply late = call("POST", "/v1/completions", kCompletion, as("sk-live"));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(late.head->status, 429);
  EXPECT_GE(waited, 0.3);
  EXPECT_NE(late.body.find("deadline"), std::string::npos) << late.body;
  EXPECT_GE(std::stoi(std::string(late.head->header("retry-after").value_or("0"))), 1);
  EXPECT_EQ(completions(a), 0u);
  // One that waits while the replica is saturated goes once it is not.
  auto pending = std::async(std::launch::async, [&] { return call("POST", "/v1/completions", kCompletion, as("sk-live")); });
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(completions(a), 0u);
  waiting->store(0);
  const Reply went = pending.get();
  EXPECT_EQ(went.head->status, 200);
  EXPECT_EQ(completions(a), 1u);
  const std::string m = metrics_as("sk-live");
  EXPECT_NE(m.find(R"(basalt_route_rejections_total{tenant="spare",reason="saturated"} 1)"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_rejections_total{tenant="live",reason="deadline"} 1)"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_queue_depth{class="live",tenant="live"} 0)"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_queue_wait_seconds_count{class="live"} 1)"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_tenant_running{tenant="live"} 0)"), std::string::npos) << m;
  // One `request` line each: the one refused in the queue never ran (no
  // replicas, pool, region or ttft_s), the one that went did.
  const std::string refused = log.line_with("tenant=live status=429");
  EXPECT_NE(refused.find(" request remote="), std::string::npos) << refused;
  EXPECT_NE(refused.find(" path=/v1/completions model=m tenant=live status=429 attempts=0 trace_id="),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.find(" queue_s="), std::string::npos) << refused;
  EXPECT_NE(refused.find(" total_s="), std::string::npos) << refused;
  for (const char* absent : {"replicas=", "pool=", "region=", "ttft_s="})
    EXPECT_EQ(refused.find(absent), std::string::npos) << absent << " " << refused;
  const std::string ran = log.line_with("tenant=live status=200");
  EXPECT_NE(ran.find(" status=200 attempts=1 replicas=" + canonical_url(parse_base_url(a.url())) + " pool="),
            std::string::npos)
      << ran;
  for (const char* present : {" region=", " trace_id=", " queue_s=", " ttft_s=", " total_s="})
    EXPECT_NE(ran.find(present), std::string::npos) << present << " " << ran;
}

// What GET /v1/autoscale says of the one autoscaled pool, once `ready` holds (10 s at most).
nlohmann::json autoscaled_pool_once(const std::function<std::string()>& get,
                                    const std::function<bool(const nlohmann::json&)>& ready) {
  nlohmann::json pool;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < until) {
    pool = nlohmann::json::parse(get())["pools"][0];
    if (ready(pool)) break;
    std::this_thread::sleep_for(10ms);
  }
  return pool;
}

TEST_F(Gateway, ATenantsRequestWaitsForItsAutoscaledPoolToGetAReadyReplica) {
  FakeReplica& a = named("a");
  TenantBook book;
  book.set(parse_tenants(R"({"classes": {"live": {"priority": 1, "queue_deadline_ms": 10000}},
                             "tenants": {"acme": {"keys": ["sk-acme"], "class": "live", "pool": "gpu"}}})",
                         "test"));
  RouteServerOptions options;
  options.tenants = &book;
  options.scrape.interval = 20ms;  // the autoscaler's evaluations (no scrapes here)
  AutoscaleConfig gpu;
  gpu.pool = "gpu";
  gpu.min_replicas = 0;
  gpu.max_replicas = 2;
  options.autoscale = {gpu};
  start_gateway({a.url() + " pool=gpu"}, options);
  registry_.snapshot()->replicas[0].state->healthy.store(false);  // loading: its probes fail
  const std::vector<std::pair<std::string, std::string>> acme = {{"Authorization", "Bearer sk-acme"}};
  auto pending = std::async(std::launch::async, [&] { return call("POST", "/v1/completions", kCompletion, acme); });
  const auto get = [&] { return call("GET", "/v1/autoscale", {}, acme).body; };
  const nlohmann::json waking = autoscaled_pool_once(get, [](const nlohmann::json& p) { return p["waiting"] == 1; });
  EXPECT_EQ(waking["pool"], "gpu");
  EXPECT_EQ(waking["current"], 0);
  EXPECT_EQ(waking["desired"], 1) << waking;
  EXPECT_NE(waking["reason"].get<std::string>().find("scaling from zero"), std::string::npos) << waking;
  EXPECT_EQ(completions(a), 0u);  // nothing went to the replica that is not ready
  registry_.snapshot()->replicas[0].state->healthy.store(true);
  const Reply served = pending.get();
  EXPECT_EQ(served.head->status, 200);
  EXPECT_EQ(served.body, R"({"from":"a"})");
  const nlohmann::json after =
      autoscaled_pool_once(get, [](const nlohmann::json& p) { return p["current"] == 1 && p["waiting"] == 0; });
  EXPECT_EQ(after["current"], 1) << after;
  EXPECT_EQ(after["waiting"], 0) << after;
  const std::string m = metrics_as("sk-acme");
  EXPECT_NE(m.find(R"(basalt_route_desired_replicas{pool="gpu"} 1)"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_ready_replicas{pool="gpu"} 1)"), std::string::npos) << m;
}

TEST_F(Gateway, ARequestForAPoolThatListsNoReplicaWaitsUntilOneIsListed) {
  FakeReplica& a = named("a");
  RouteServerOptions options;
  options.scrape.interval = 20ms;
  AutoscaleConfig every;  // pool "": every replica, the home of requests without one
  every.min_replicas = 0;
  options.autoscale = {every};
  options.cold_start_timeout = 10s;
  start_gateway({a.url()}, options);
  const std::vector<ReplicaSpec> listed = {parse_replica(a.url(), "test")};
  registry_.set_allowing_none({});  // scaled to zero: DNS lists nothing
  // Its model cannot be checked against no replica: it waits rather than 404.
  auto pending = std::async(std::launch::async, [&] { return call("POST", "/v1/completions", kCompletion); });
  const auto get = [&] { return call("GET", "/v1/autoscale").body; };
  const nlohmann::json waking = autoscaled_pool_once(get, [](const nlohmann::json& p) { return p["waiting"] == 1; });
  EXPECT_EQ(waking["desired"], 1) << waking;
  EXPECT_EQ(waking["current"], 0);
  registry_.set(listed);
  const Reply served = pending.get();
  EXPECT_EQ(served.head->status, 200);
  EXPECT_EQ(served.body, R"({"from":"a"})");
  // A route that is not for a model is not held.
  registry_.set_allowing_none({});
  EXPECT_EQ(call("GET", "/v1/models").head->status, 503);
}

TEST_F(Gateway, AClientGoneWhileQueuedLeavesTheQueueWithItsTokensBack) {
  const auto waiting = std::make_shared<std::atomic<int>>(9);
  FakeReplica& a = metered("a", waiting);
  TenantBook book;
  // 20 tokens a minute; a request here is estimated at 17 (1 for "hi", 16
  // for the default max_tokens), so a second fits only after a refund.
  book.set(parse_tenants(R"({"tenants": {"t": {"keys": ["sk-t"], "limits": {"tokens_per_min": 20}}}})", "test"));
  RouteServerOptions options;
  options.tenants = &book;
  ASSERT_TRUE(start_scraping_gateway({a.url()}, options, {9}));
  OutgoingRequest req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = kCompletion;
  req.headers = {{"Authorization", "Bearer sk-t"}};
  const ExchangeHandle h = client_->send(req, ExchangeCallbacks{});
  const auto until = std::chrono::steady_clock::now() + 10s;
  const auto wait_for = [&](const std::string& needle) {
    while (metrics_as("sk-t").find(needle) == std::string::npos && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(5ms);
    return metrics_as("sk-t").find(needle) != std::string::npos;
  };
  ASSERT_TRUE(wait_for(R"(basalt_route_queue_depth{class="default",tenant="t"} 1)"));
  h.cancel();
  EXPECT_TRUE(wait_for(R"(basalt_route_requests_total{route="/v1/completions",status="499"} 1)"));
  const std::string m = metrics_as("sk-t");
  EXPECT_NE(m.find(R"(basalt_route_queue_depth{class="default",tenant="t"} 0)"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_tenant_running{tenant="t"} 0)"), std::string::npos) << m;
  EXPECT_NE(m.find("basalt_route_requests_in_flight 0"), std::string::npos) << m;
  waiting->store(0);
  const Reply r = call("POST", "/v1/completions", kCompletion, {{"Authorization", "Bearer sk-t"}});
  EXPECT_EQ(r.head->status, 200) << r.body;
  EXPECT_EQ(completions(a), 1u);
  // The answer used 1 of its 16 completion tokens: 15 back, 18 now; a
  // third fits, a fourth does not.
  EXPECT_EQ(call("POST", "/v1/completions", kCompletion, {{"Authorization", "Bearer sk-t"}}).head->status, 200);
  const Reply refused = call("POST", "/v1/completions", kCompletion, {{"Authorization", "Bearer sk-t"}});
  EXPECT_EQ(refused.head->status, 429);
  EXPECT_NE(refused.body.find("token rate limit"), std::string::npos) << refused.body;
}

// Regions (ROUTER.md §5): a tenant restricted to eu whose only eu replica
// dies mid-stream gets the stream's error event, never a resumption on the
// us replica; and, that replica gone, a 503 naming the region.
TEST_F(Failover, ARegionRestrictedStreamIsNeverResumedOutsideItsRegion) {
  FakeReplica& eu = streaming(kFirst, true, &aborts_);
  FakeReplica& us = continuing();
  TenantBook book;
  book.set(parse_tenants(R"({"tenants": {"acme": {"keys": ["sk-acme"], "regions": ["eu"]}}})", "test"));
  RouteServerOptions options;
  options.tenants = &book;
  start_gateway({eu.url() + " region=eu", us.url() + " region=us"}, options);
  std::thread killer([&] {
    while (eu.requests() == 0) std::this_thread::sleep_for(5ms);
    std::this_thread::sleep_for(100ms);
    eu.server->stop();
  });
  const Reply r = call("POST", "/v1/completions", R"({"model":"m","stream":true,"prompt":"x","n":2,"seed":42})",
                       {{"Authorization", "Bearer sk-acme"}});
  killer.join();
  ASSERT_TRUE(r.head);
  EXPECT_EQ(r.head->status, 200);
  EXPECT_EQ(r.body.rfind("data: {\"created\":123", 0), 0u) << r.body;
  EXPECT_NE(r.body.find("\"code\":\"upstream_failed\""), std::string::npos) << r.body;
  EXPECT_TRUE(r.body.ends_with("data: [DONE]\n\n")) << r.body;
  // Before the first byte: the dead eu replica is tried, then 503.
  const Reply refused = call("POST", "/v1/completions", R"({"model":"m","prompt":"x"})",
                             {{"Authorization", "Bearer sk-acme"}});
  ASSERT_TRUE(refused.head);
  EXPECT_EQ(refused.head->status, 503);
  EXPECT_NE(refused.body.find("allowed regions (eu)"), std::string::npos) << refused.body;
  EXPECT_EQ(us.requests(), 0u);
  const std::string m = metrics_as("sk-acme");
  EXPECT_NE(m.find(R"(basalt_route_region_refusals_total{tenant="acme",reason="no_replica"} 2)"), std::string::npos)
      << m;
}

TEST_F(Gateway, XBasaltRegionNarrowsTheRegionsAndIsNotForwarded) {
  FakeReplica& eu = named("eu");
  FakeReplica& us = named("us");
  TenantBook book;
  book.set(parse_tenants(R"({"tenants": {"acme": {"keys": ["sk-acme"], "regions": ["eu", "us"]},
                                         "free": {"keys": ["sk-free"]}}})",
                         "test"));
  RouteServerOptions options;
  options.tenants = &book;
  options.policy = Policy::kRoundRobin;
  start_gateway({eu.url() + " region=eu", us.url() + " region=us"}, options);
  const auto as = [](const char* key, const char* region) {
    std::vector<std::pair<std::string, std::string>> h = {{"Authorization", std::string("Bearer ") + key}};
    if (region != nullptr) h.emplace_back("X-Basalt-Region", region);
    return h;
  };
  // Narrowed to us: every request there.
  for (int i = 0; i < 4; ++i) {
    const Reply r = call("POST", "/v1/completions", kCompletion, as("sk-acme", "us"));
    EXPECT_EQ(r.body, R"({"from":"us"})");
  }
  // Without the header both regions take requests (round-robin).
  std::set<std::string> from;
  for (int i = 0; i < 4; ++i) from.insert(call("POST", "/v1/completions", kCompletion, as("sk-acme", nullptr)).body);
  EXPECT_EQ(from.size(), 2u);
  // Outside the tenant's regions: 403; malformed: 400; neither forwarded.
  const Reply forbidden = call("POST", "/v1/completions", kCompletion, as("sk-acme", "ap"));
  EXPECT_EQ(forbidden.head->status, 403);
  EXPECT_NE(forbidden.body.find("may not use: ap"), std::string::npos) << forbidden.body;
  EXPECT_EQ(call("POST", "/v1/completions", kCompletion, as("sk-acme", "us;eu")).head->status, 400);
  // A tenant without regions: the header alone restricts.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(call("POST", "/v1/completions", kCompletion, as("sk-free", "eu")).body, R"({"from":"eu"})");
  // A region no replica is in: 503 naming it.
  const Reply none = call("POST", "/v1/completions", kCompletion, as("sk-free", "ap"));
  EXPECT_EQ(none.head->status, 503);
  EXPECT_NE(none.body.find("allowed regions (ap)"), std::string::npos) << none.body;
  EXPECT_EQ(completions(us), 6u);
  EXPECT_EQ(completions(eu), 5u);
  for (FakeReplica* f : {&eu, &us}) {
    std::lock_guard<std::mutex> lock(f->mu);
    for (const HttpRequest& got : f->got) EXPECT_FALSE(got.header("x-basalt-region")) << got.path;
  }
  const std::string m = metrics_as("sk-acme");
  EXPECT_NE(m.find(R"(basalt_route_region_refusals_total{tenant="acme",reason="forbidden"} 1)"), std::string::npos)
      << m;
  EXPECT_NE(m.find(R"(basalt_route_region_refusals_total{tenant="free",reason="no_replica"} 1)"), std::string::npos)
      << m;
}

// Overflow (ROUTER.md §5): the home pool's EQT, 40 waiting requests of
// ~100 tokens at an assumed 1,000 tokens/s = 4 s, is past the class's 1 s
// objective: a request goes to the overflow pool with the lowest EQT among
// those inside its regions (c is listed first and idle, but in us), and
// comes home once the home pool's queue is gone.
TEST_F(Gateway, AnOverflowingHomePoolSendsRequestsToAnOverflowPoolInsideTheRegions) {
  const auto home_waiting = std::make_shared<std::atomic<int>>(40);
  FakeReplica& a = metered("a", home_waiting);
  FakeReplica& b = metered("b", std::make_shared<std::atomic<int>>(0));
  FakeReplica& c = metered("c", std::make_shared<std::atomic<int>>(0));
  TenantBook book;
  book.set(parse_tenants(R"({"classes": {"live": {"priority": 1, "ttft_slo_ms": 1000, "queue_deadline_ms": 5000}},
                             "tenants": {"acme": {"keys": ["sk-acme"], "class": "live", "regions": ["eu"],
                                                  "pool": "a", "overflow_pools": ["c", "b"]}}})",
                         "test"));
  RouteServerOptions options;
  options.tenants = &book;
  options.assumed_prefill_rate = 1000;
  ASSERT_TRUE(start_scraping_gateway(
      {a.url() + " region=eu pool=a", b.url() + " region=eu pool=b", c.url() + " region=us pool=c"}, options,
      {40, 0, 0}));
  const std::string body = R"({"model":"m","prompt":")" + std::string(400, 'x') + "\"}";
  const std::vector<std::pair<std::string, std::string>> key = {{"Authorization", "Bearer sk-acme"}};
  const Reply over = call("POST", "/v1/completions", body, key);
  EXPECT_EQ(over.body.substr(0, 12), R"({"from":"b",)") << over.body;
  std::string m = metrics_as("sk-acme");
  EXPECT_NE(m.find(R"(basalt_route_pool_overflowing{pool="a",class="live"} 1)"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_pool_requests_total{pool="b",overflow="true"} 1)"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_pool_estimated_queue_seconds{pool="a"} 4)"), std::string::npos) << m;
  // The home queue drains: EQT 0.1 s (the request's own queued tokens), below 0.8 s.
  home_waiting->store(0);
  ASSERT_TRUE(scraped(registry_, {0, 0, 0}));
  const Reply home = call("POST", "/v1/completions", body, key);
  EXPECT_EQ(home.body.substr(0, 12), R"({"from":"a",)") << home.body;
  m = metrics_as("sk-acme");
  EXPECT_NE(m.find(R"(basalt_route_pool_overflowing{pool="a",class="live"} 0)"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_pool_requests_total{pool="a",overflow="false"} 1)"), std::string::npos) << m;
  EXPECT_EQ(completions(c), 0u);
}

// W3C trace context (ROUTER.md §6): each attempt is a new span of the
// client's trace, or of a new one; latencies by replica and tenant.
TEST_F(Gateway, EachAttemptIsASpanOfTheTraceAndLatenciesAreCounted) {
  FakeReplica& busy = replica([](HttpRequest&) { return whole(503, R"({"error":"busy"})"); });
  FakeReplica& a = named("a");
  TenantBook book;
  book.set(parse_tenants(R"({"tenants": {"acme": {"keys": ["sk-acme"]}}})", "test"));
  RouteServerOptions options;
  options.tenants = &book;
  options.policy = Policy::kRoundRobin;  // busy first, then a, each time
  start_gateway({busy.url(), a.url()}, options);
  const std::string client = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  const Reply r = call("POST", "/v1/completions", kCompletion,
                       {{"Authorization", "Bearer sk-acme"}, {"traceparent", client}, {"tracestate", "v=1,w=2"}});
  EXPECT_EQ(r.body, R"({"from":"a"})");
  ASSERT_EQ(busy.requests(), 1u);
  ASSERT_EQ(a.requests(), 1u);
  const std::string first(busy.got[0].header("traceparent").value_or(""));
  const std::string second(a.got[0].header("traceparent").value_or(""));
  for (const std::string& p : {first, second}) {
    EXPECT_TRUE(valid_traceparent(p)) << p;
    EXPECT_EQ(p.substr(0, 36), client.substr(0, 36)) << p;  // the client's trace
    EXPECT_EQ(p.substr(52), "-01") << p;                    // and flags
    EXPECT_NE(p.substr(36, 16), client.substr(36, 16)) << p;
  }
  EXPECT_NE(first.substr(36, 16), second.substr(36, 16));
  EXPECT_EQ(busy.got[0].header("tracestate").value_or(""), "v=1,w=2");
  EXPECT_EQ(a.got[0].header("tracestate").value_or(""), "v=1,w=2");
  // Without a traceparent (an invalid one alike): a new trace, no tracestate.
  call("POST", "/v1/completions", kCompletion,
       {{"Authorization", "Bearer sk-acme"}, {"traceparent", "00-bogus"}, {"tracestate", "v=1"}});
  ASSERT_EQ(a.requests(), 2u);
  const std::string fresh(a.got[1].header("traceparent").value_or(""));
  EXPECT_TRUE(valid_traceparent(fresh)) << fresh;
  EXPECT_NE(fresh.substr(3, 32), client.substr(3, 32));
  EXPECT_EQ(fresh.substr(52), "-00");
  EXPECT_FALSE(a.got[1].header("tracestate"));
  const std::string m = metrics_as("sk-acme");
  const std::string a_id = canonical_url(parse_base_url(a.url()));
  for (const char* family : {"basalt_route_replica_ttft_seconds", "basalt_route_replica_request_seconds"})
    EXPECT_NE(m.find(std::string(family) + "_count{replica=\"" + a_id + "\"} 2"), std::string::npos) << family << m;
  for (const char* family : {"basalt_route_tenant_ttft_seconds", "basalt_route_tenant_request_seconds"})
    EXPECT_NE(m.find(std::string(family) + "_count{tenant=\"acme\"} 2"), std::string::npos) << family << m;
  // The busy replica answered nothing: no latency of its own.
  EXPECT_EQ(m.find("_seconds_count{replica=\"" + canonical_url(parse_base_url(busy.url())) + "\"}"), std::string::npos)
      << m;
}

// ROUTER.md §6: a request retried once counts one retry, by the replica it
// left and how that attempt ended; every relayed event, and a whole
// answer's body, counts the time the gateway held it.
TEST_F(Gateway, CountsRetriesAndTheTimeTheGatewayHoldsWhatItRelays) {
  FakeReplica& busy = replica([](HttpRequest&) { return whole(503, R"({"error":"busy"})"); });
  FakeReplica& a = named("a");
  RouteServerOptions options;
  options.policy = Policy::kRoundRobin;  // busy first, then a
  start_gateway({busy.url(), a.url()}, options);
  EXPECT_EQ(call("POST", "/v1/completions", kCompletion).body, R"({"from":"a"})");
  const std::string busy_id = canonical_url(parse_base_url(busy.url()));
  std::string m = metrics();
  EXPECT_NE(m.find("basalt_route_retries_total{replica=\"" + busy_id + "\",reason=\"unavailable\"} 1"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("basalt_route_retries_total{replica=\"" + canonical_url(parse_base_url(a.url()))),
            std::string::npos)
      << m;
  EXPECT_NE(m.find(R"(basalt_route_added_latency_seconds_count{kind="body"} 1)"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_added_latency_seconds_bucket{kind="body",le="1"} 1)"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_added_latency_seconds_count{kind="event"} 0)"), std::string::npos) << m;
  // A stream retried away from a replica that refuses connections: three
  // events relayed (the heartbeat comment is not one), one retry.
  FakeReplica& refused = replica([](HttpRequest&) { return whole(200, "{}"); });
  const std::string refused_url = refused.url();
  refused.server->stop();
  FakeReplica& streamer = streaming("data: {\"i\":1}\n\n: hb\n\ndata: {\"i\":2}\n\ndata: [DONE]\n\n", false);
  start_gateway({refused_url, streamer.url()}, options);
  const Reply r = call("POST", "/v1/completions", R"({"model":"m","stream":true,"prompt":"x"})");
  EXPECT_EQ(r.body, "data: {\"i\":1}\n\ndata: {\"i\":2}\n\ndata: [DONE]\n\n");
  m = metrics();
  EXPECT_NE(m.find("basalt_route_retries_total{replica=\"" + canonical_url(parse_base_url(refused_url)) +
                   "\",reason=\"unreachable\"} 1"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find(R"(basalt_route_added_latency_seconds_count{kind="event"} 3)"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_added_latency_seconds_bucket{kind="event",le="1"} 3)"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(basalt_route_added_latency_seconds_count{kind="body"} 0)"), std::string::npos) << m;
}

}  // namespace
}  // namespace basalt::router

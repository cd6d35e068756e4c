#include "router/proxy.h"

#include <utility>

#include <nlohmann/json.hpp>

#include "server/openai_protocol.h"
#include "server/sse.h"

namespace basalt::router {

ReplicaClients::ReplicaClients(boost::asio::io_context& io, HttpClientOptions options)
    : io_(io), options_(std::move(options)) {}

ReplicaClients::~ReplicaClients() = default;

HttpClient& ReplicaClients::of(const ReplicaSpec& replica) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = clients_.find(replica.id);
  if (it == clients_.end()) it = clients_.emplace(replica.id, std::make_unique<HttpClient>(io_, replica.url, options_)).first;
  return *it->second;
}

const char* attempt_outcome_name(AttemptOutcome outcome) {
  switch (outcome) {
    case AttemptOutcome::kAnswered: return "answered";
    case AttemptOutcome::kRetryable: return "retryable";
    case AttemptOutcome::kFailed: return "failed";
    case AttemptOutcome::kCancelled: return "cancelled";
  }
  return "failed";
}

namespace {

bool retryable_status(int status) { return status == 429 || status == 502 || status == 503 || status == 504; }

// The error event that ends a stream whose replica failed after its head.
std::string stream_error(const std::string& failure) {
  return nlohmann::json{{"error",
                         {{"message", "the replica failed while streaming (" + failure + ")"},
                          {"type", "server_error"},
                          {"param", nullptr},
                          {"code", "upstream_failed"}}}}
      .dump();
}

HttpResponse error_response(int status, const std::string& message) {
  HttpResponse r;
  r.status = status;
  r.body = error_body(status, message, "server_error");
  return r;
}

}  // namespace

// Shared by the producer (the client connection's strand) and the attempt
// callbacks (the replica client's strand); `mu` guards everything.
struct ProxyProducer::State : std::enable_shared_from_this<State> {
  ReplicaClients& clients;
  ProxyRequest request;
  std::mutex mu;
  std::function<void()> wake;
  // The attempt in flight.
  std::shared_ptr<const Replica> replica;
  ExchangeHandle exchange;
  uint64_t attempt_id = 0;  // callbacks of an earlier attempt are ignored
  std::vector<std::string> tried;
  std::string last_failure;
  // What the attempt in flight has received.
  int status = 0;
  std::string content_type;
  std::vector<std::pair<std::string, std::string>> passed_headers;  // X-Request-Id, Retry-After
  bool streaming = false;  // a 200 text/event-stream: passed on as it comes
  std::string body;        // a whole answer's body so far
  std::unique_ptr<SseParser> events;
  // What the client gets.
  std::optional<HttpResponse> head;  // set once; taken by pull()
  bool head_sent = false;
  std::string pending;  // stream bytes not yet pulled
  bool done = false;
  bool aborted = false;
  bool finished_reported = false;
  int final_status = 0;
  // The last replica's 429/502/503/504, passed on when no other is left.
  std::optional<HttpResponse> fallback;

  State(ReplicaClients& c, ProxyRequest r) : clients(c), request(std::move(r)) {}

  // Under mu: sends the request to the next replica, or answers the client
  // when none is left.
  void next_attempt() {
    if (aborted || done) return;
    std::shared_ptr<const Replica> to;
    if (static_cast<int>(tried.size()) < request.max_attempts && request.pick) to = request.pick(tried);
    if (!to) {
      if (fallback) {  // a replica's 429/502/503/504, passed on as it came
        HttpResponse r = std::move(*fallback);
        fallback.reset();
        finish(std::move(r));
      } else {
        finish(tried.empty() ? error_response(503, "no replica is available for this request")
                             : error_response(502, "the replicas failed this request (last: " + last_failure + ")"));
      }
      return;
    }
    replica = to;
    tried.push_back(to->spec.id);
    status = 0;
    body.clear();
    passed_headers.clear();
    streaming = false;
    events.reset();
    const uint64_t id = ++attempt_id;
    to->state->in_flight.fetch_add(1);
    std::weak_ptr<State> weak = weak_from_this();
    ExchangeCallbacks callbacks;
    callbacks.on_head = [weak, id](const IncomingHead& h) {
      if (auto self = weak.lock()) self->on_head(id, h);
    };
    callbacks.on_data = [weak, id](std::string_view bytes) {
      if (auto self = weak.lock()) self->on_data(id, bytes);
    };
    // on_done holds the state: the in-flight count must come down even
    // when the client went away first.
    auto self = shared_from_this();
    callbacks.on_done = [self, id, to](HttpFailure failure, const std::string& message) {
      to->state->in_flight.fetch_sub(1);
      self->on_done(id, failure, message);
    };
    HttpClient* client = nullptr;
    try {
      client = &clients.of(to->spec);
    } catch (const std::exception& e) {  // the replica's host no longer resolves
      to->state->in_flight.fetch_sub(1);
      last_failure = to->spec.id + ": " + e.what();
      observe_attempt(AttemptOutcome::kFailed);
      next_attempt();
      return;
    }
    exchange = client->send(request.upstream, std::move(callbacks));
  }

  void on_head(uint64_t id, const IncomingHead& h) {
    std::lock_guard<std::mutex> lock(mu);
    if (id != attempt_id || aborted || done) return;
    status = h.status;
    content_type = std::string(h.header("content-type").value_or("application/json"));
    for (const char* name : {"x-request-id", "retry-after"})
      if (const auto v = h.header(name)) passed_headers.emplace_back(name, std::string(*v));
    if (status == 200 && content_type.rfind("text/event-stream", 0) == 0) {
      streaming = true;
      events = std::make_unique<SseParser>([](std::string_view) {});
      events->on_raw([this](std::string_view raw) { pending.append(raw); });
      HttpResponse r;
      r.status = 200;
      r.content_type = content_type;
      r.headers = passed_headers;
      head = std::move(r);
      wake_client();
    }
  }

  void on_data(uint64_t id, std::string_view bytes) {
    std::lock_guard<std::mutex> lock(mu);
    if (id != attempt_id || aborted || done) return;
    if (!streaming) {
      body.append(bytes);
      return;
    }
    const size_t before = pending.size();
    if (!events->feed(bytes)) {
      // An event past the parser's bound: the stream cannot be passed on
      // event by event. The exchange is ended; on_done sees the cut.
      last_failure = replica->spec.id + ": " + events->error();
      exchange.cancel();
      return;
    }
    if (pending.size() != before) wake_client();
  }

  void on_done(uint64_t id, HttpFailure failure, const std::string& message) {
    std::lock_guard<std::mutex> lock(mu);
    if (id != attempt_id) return;
    if (aborted) {
      observe_attempt(AttemptOutcome::kCancelled);
      return;
    }
    if (done) return;
    if (streaming) {
      // The head went out with the replica's 200: nothing can be retried.
      if (failure == HttpFailure::kNone && events->error().empty()) {
        observe_attempt(AttemptOutcome::kAnswered);
        done = true;
        final_status = 200;
        wake_client();
        return;
      }
      last_failure = replica->spec.id + ": " + (failure == HttpFailure::kNone ? events->error() : message);
      observe_attempt(AttemptOutcome::kFailed);
      pending += "data: " + stream_error(last_failure) + "\n\ndata: [DONE]\n\n";
      done = true;
      final_status = 200;
      wake_client();
      return;
    }
    if (failure != HttpFailure::kNone) {
      last_failure = replica->spec.id + ": " + http_failure_name(failure) + (message.empty() ? "" : " (" + message + ")");
      observe_attempt(AttemptOutcome::kFailed);
      next_attempt();
      return;
    }
    HttpResponse r;
    r.status = status;
    r.content_type = content_type;
    r.headers = passed_headers;
    r.body = std::move(body);
    if (retryable_status(status)) {
      last_failure = replica->spec.id + ": status " + std::to_string(status);
      observe_attempt(AttemptOutcome::kRetryable);
      fallback = std::move(r);  // passed on if no other replica is left
      next_attempt();
      return;
    }
    observe_attempt(AttemptOutcome::kAnswered);
    finish(std::move(r));
  }

  void finish(HttpResponse r) {
    final_status = r.status;
    head = std::move(r);
    done = true;
    wake_client();
  }

  void observe_attempt(AttemptOutcome outcome) {
    if (request.observe.attempt && replica) request.observe.attempt(replica->spec, outcome);
  }

  void wake_client() {
    if (wake) wake();
  }
};

ProxyProducer::ProxyProducer(ReplicaClients& clients, ProxyRequest request)
    : state_(std::make_shared<State>(clients, std::move(request))) {}

ProxyProducer::~ProxyProducer() {
  // The transport drops a producer after done or abort(); either way the
  // attempt (if any) is over or cancelled, and its on_done keeps the state.
  abort();
}

void ProxyProducer::start(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->wake = std::move(wake);
  state_->next_attempt();
}

void ProxyProducer::pull(Output& out) {
  std::function<void(int, const std::vector<std::string>&)> finished;
  int status = 0;
  std::vector<std::string> tried;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    State& s = *state_;
    if (!s.head_sent && s.head) {
      out.head = std::move(*s.head);
      s.head.reset();
      s.head_sent = true;
    }
    if (!s.head_sent) return;
    out.data += s.pending;
    s.pending.clear();
    out.done = s.done;
    if (s.done && !s.finished_reported) {
      s.finished_reported = true;
      finished = s.request.observe.finished;
      status = s.final_status;
      tried = s.tried;
    }
  }
  if (finished) finished(status, tried);
}

void ProxyProducer::abort() {
  std::lock_guard<std::mutex> lock(state_->mu);
  State& s = *state_;
  if (s.aborted || (s.done && s.head_sent && s.pending.empty())) return;
  s.aborted = true;
  s.wake = nullptr;
  s.exchange.cancel();
}

}  // namespace basalt::router

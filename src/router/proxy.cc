#include "router/proxy.h"

#include <algorithm>
#include <boost/asio/steady_timer.hpp>
#include <map>
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

void ResidenceHistogram::add(Clock::duration held) {
  const double seconds = std::chrono::duration<double>(held).count();
  const auto bucket = std::lower_bound(std::begin(kBounds), std::end(kBounds), seconds) - std::begin(kBounds);
  buckets_[static_cast<size_t>(bucket)].fetch_add(1, std::memory_order_relaxed);
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(held).count();
  sum_ns_.fetch_add(static_cast<uint64_t>(std::max<int64_t>(ns, 0)), std::memory_order_relaxed);
}

ResidenceHistogram::Counts ResidenceHistogram::counts() const {
  Counts c;
  for (size_t i = 0; i < kBuckets; ++i) {
    c.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
    c.count += c.buckets[i];
  }
  c.sum = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
  return c;
}

const char* attempt_outcome_name(AttemptOutcome outcome) {
  switch (outcome) {
    case AttemptOutcome::kAnswered: return "answered";
    case AttemptOutcome::kBusy: return "busy";
    case AttemptOutcome::kUnavailable: return "unavailable";
    case AttemptOutcome::kUnreachable: return "unreachable";
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

// How many choices a completion or chat asks for, as a replica counts them
// (its prompts times n); 0 when the body does not say it plainly (a body
// the replica refuses is never resumed).
int64_t choice_count(const nlohmann::json& body) {
  int64_t n = 1;
  if (const auto it = body.find("n"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1) return 0;
    n = it->get<int64_t>();
  }
  int64_t prompts = 0;
  if (body.contains("messages")) {
    prompts = 1;
  } else if (const auto p = body.find("prompt"); p != body.end()) {
    if (p->is_string()) prompts = 1;
    else if (p->is_array() && !p->empty()) prompts = (*p)[0].is_number() ? 1 : static_cast<int64_t>(p->size());
  }
  return n <= 4096 && prompts * n <= 4096 ? prompts * n : 0;  // basalt_resume lists at most 4096
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
  using Clock = std::chrono::steady_clock;

  ReplicaClients& clients;
  ProxyRequest request;
  std::mutex mu;
  std::function<void()> wake;
  // The attempt in flight.
  std::shared_ptr<const Replica> replica;
  ExchangeHandle exchange;
  uint64_t attempt_id = 0;  // callbacks of an earlier attempt are ignored
  // The attempt whose replica has begun answering (its stream passed an
  // event on); 0: none. Its ReplicaState was told (attempt_answering).
  uint64_t answering_attempt = 0;
  uint64_t attempt_generation = 0;  // the current attempt's, from attempt_started()
  std::vector<std::string> tried;
  std::string last_failure;
  // What the attempt in flight has received.
  int status = 0;
  std::string content_type;
  std::vector<std::pair<std::string, std::string>> passed_headers;  // X-Request-Id, Retry-After
  bool streaming = false;  // a 200 text/event-stream: passed on as it comes
  std::string body;        // a whole answer's body so far
  std::unique_ptr<SseParser> events;
  std::string event_raw;   // the event on_raw just reported, until its data comes
  bool saw_done = false;   // this attempt's `data: [DONE]` went out
  bool cut = false;        // this attempt sent cut_by_server
  bool stalled = false;    // this attempt was ended for silence
  Clock::time_point last_byte;
  // The attempt before this one failed before the client's head: the
  // replica and why, told to observe.retry when another is tried.
  std::shared_ptr<const Replica> retry_from;
  AttemptOutcome retry_why = AttemptOutcome::kFailed;
  // What the client gets.
  std::optional<HttpResponse> head;  // set once; taken by pull()
  bool committed = false;            // a stream's head is the client's: no more retries
  bool head_sent = false;
  std::string pending;  // stream bytes not yet pulled
  // With request.added_latency: when the last byte of each replica event
  // in `pending` arrived, and of a whole answer waiting in `head`.
  std::vector<Clock::time_point> pending_at;
  std::optional<Clock::time_point> body_at;
  bool done = false;
  bool aborted = false;
  bool finished_reported = false;
  int final_status = 0;
  // The last replica's 429/502/503/504, passed on when no other is left.
  std::optional<HttpResponse> fallback;
  // Failover: the request body, and per choice what its forwarded events
  // hold (the `: basalt` comments of an event wait in `infos` until it goes
  // out). A choice is in `resumed` once the client has a chunk of it (the
  // replica comments its role delta or echo too); the others, of the body's
  // `choices`, are resumed as not announced. `cached_tokens`: the usage's
  // cached prompt tokens, as the last comment that went out said.
  nlohmann::json body_json;
  int64_t choices = 0;
  std::optional<int64_t> cached_tokens;
  struct Resumed {
    std::vector<int32_t> ids;
    int64_t offset = 0;
    bool finished = false;
  };
  std::map<int64_t, Resumed> resumed;
  std::vector<nlohmann::json> infos;
  std::optional<int64_t> created;
  int failovers = 0;
  std::unique_ptr<boost::asio::steady_timer> stall_timer;
  int64_t completion_tokens = -1;  // from the answer's usage
  bool first_byte_seen = false;

  State(ReplicaClients& c, ProxyRequest r) : clients(c), request(std::move(r)) {
    if (!request.failover.enabled) return;
    body_json = nlohmann::json::parse(request.upstream.body, nullptr, /*allow_exceptions=*/false);
    if (!body_json.is_object()) {
      request.failover.enabled = false;
      return;
    }
    choices = choice_count(body_json);
    const auto beat = std::clamp<int64_t>(request.failover.stall_timeout.count() / 4, 100, 60000);
    request.upstream.headers.emplace_back("X-Basalt-Heartbeat", std::to_string(beat));
    request.upstream.headers.emplace_back("X-Basalt-Resume-Info", "1");
  }

  // Under mu: sends the request to the next replica, or answers the client
  // when none is left.
  void next_attempt() {
    if (aborted || done) return;
    std::shared_ptr<const Replica> to;
    if (static_cast<int>(tried.size()) < request.max_attempts + failovers && request.pick) to = request.pick(tried);
    if (!to) {
      retry_from.reset();
      if (committed) {
        end_stream_with_error();
      } else if (fallback) {  // a replica's 429/502/503/504, passed on as it came
        HttpResponse r = std::move(*fallback);
        fallback.reset();
        finish(std::move(r));
      } else if (!request.no_replica_message.empty()) {  // a constraint ran out of replicas: say which
        finish(error_response(503, request.no_replica_message +
                                       (tried.empty() ? std::string() : " (last failure: " + last_failure + ")")));
      } else {
        finish(tried.empty() ? error_response(503, "no replica is available for this request")
                             : error_response(502, "the replicas failed this request (last: " + last_failure + ")"));
      }
      return;
    }
    if (retry_from) {
      if (request.observe.retry) request.observe.retry(retry_from->spec, retry_why);
      retry_from.reset();
    }
    replica = to;
    tried.push_back(to->spec.id);
    status = 0;
    body.clear();
    passed_headers.clear();
    streaming = false;
    events.reset();
    event_raw.clear();
    infos.clear();
    saw_done = cut = stalled = false;
    last_byte = Clock::now();
    const uint64_t id = ++attempt_id;
    const uint64_t generation = to->state->attempt_started();
    attempt_generation = generation;
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
    callbacks.on_done = [self, id, to, generation](HttpFailure failure, const std::string& message) {
      bool answering = false;
      {
        std::lock_guard<std::mutex> lock(self->mu);
        answering = self->answering_attempt == id;
      }
      to->state->attempt_ended(generation, answering);
      self->on_done(id, failure, message);
    };
    HttpClient* client = nullptr;
    try {
      client = &clients.of(to->spec);
    } catch (const std::exception& e) {  // the replica's host no longer resolves
      to->state->attempt_ended(generation);
      last_failure = to->spec.id + ": " + e.what();
      attempt_failed("eof", AttemptOutcome::kUnreachable);
      return;
    }
    OutgoingRequest upstream = request.upstream;
    if (committed) upstream.body = resume_body();
    if (request.trace) {
      upstream.headers.emplace_back("traceparent", attempt_traceparent(*request.trace));
      if (!request.trace->tracestate.empty()) upstream.headers.emplace_back("tracestate", request.trace->tracestate);
    }
    exchange = client->send(std::move(upstream), std::move(callbacks));
    if (request.failover.enabled && !stall_timer) watch_for_stalls();
  }

  // The request body with `basalt_resume`: each choice's tokens and text
  // as far as the client has them (a choice it has no chunk of: not
  // announced, so the replica sends its role delta or echo), and the first
  // attempt's cached prompt tokens, so that the usage is the one a run
  // without the failure reports.
  std::string resume_body() const {
    std::map<int64_t, nlohmann::json> entries;
    for (int64_t i = 0; i < choices; ++i) entries[i] = {{"index", i}, {"announced", false}};
    for (const auto& [index, r] : resumed)
      entries[index] = {{"index", index}, {"output_token_ids", r.ids}, {"text_offset", r.offset},
                        {"finished", r.finished}};
    nlohmann::json list = nlohmann::json::array();
    for (auto& [index, entry] : entries) list.push_back(std::move(entry));
    nlohmann::json b = body_json;
    b["basalt_resume"] = {{"choices", std::move(list)}};
    if (created) b["basalt_resume"]["created"] = *created;
    if (cached_tokens) b["basalt_resume"]["prior_usage"] = {{"cached_tokens", *cached_tokens}};
    return b.dump();
  }

  void on_head(uint64_t id, const IncomingHead& h) {
    std::lock_guard<std::mutex> lock(mu);
    if (id != attempt_id || aborted || done) return;
    last_byte = Clock::now();
    status = h.status;
    if (request.observe.head) request.observe.head();
    content_type = std::string(h.header("content-type").value_or("application/json"));
    for (const char* name : {"x-request-id", "retry-after"})
      if (const auto v = h.header(name)) passed_headers.emplace_back(name, std::string(*v));
    if (status != 200 || content_type.rfind("text/event-stream", 0) != 0) return;
    streaming = true;
    events = std::make_unique<SseParser>([this](std::string_view data) { on_event(data); });
    events->on_raw([this](std::string_view raw) {
      flush_event_raw();  // one without data (none is expected)
      event_raw.assign(raw);
    });
    events->on_comment([this](std::string_view comment) { on_comment(comment); });
    if (committed) return;  // a resumed stream: the client has its head
    committed = true;
    HttpResponse r;
    r.status = 200;
    r.content_type = content_type;
    r.headers = passed_headers;
    head = std::move(r);
    wake_client();
  }

  void on_data(uint64_t id, std::string_view bytes) {
    const auto now = Clock::now();  // before the lock: waiting for it is the gateway's time too
    std::lock_guard<std::mutex> lock(mu);
    if (id != attempt_id || aborted || done) return;
    last_byte = now;
    if (!streaming) {
      body.append(bytes);
      return;
    }
    const size_t before = pending.size();
    const bool fed = events->feed(bytes);
    flush_event_raw();
    if (!fed) {
      // An event past the parser's bound: the stream cannot be passed on
      // event by event. The exchange is ended; on_done sees the cut.
      last_failure = replica->spec.id + ": " + events->error();
      exchange.cancel();
    } else if (cut) {
      exchange.cancel();
    }
    if (pending.size() != before) {
      if (answering_attempt != id) {
        answering_attempt = id;
        replica->state->attempt_answering(attempt_generation);
      }
      note_first_byte();
      wake_client();
    }
  }

  void note_first_byte() {
    if (first_byte_seen || !replica) return;
    first_byte_seen = true;
    if (request.observe.first_byte) request.observe.first_byte(replica->spec);
  }

  // A complete event: passed on, with what its comments said applied.
  void on_event(std::string_view data) {
    const std::string raw = std::move(event_raw);
    event_raw.clear();
    if (raw.empty() || cut || saw_done) return;  // nothing of this attempt after those
    if (data == "[DONE]") {
      saw_done = true;
      relay(raw);
      return;
    }
    if (request.failover.enabled && data.find("cut_by_server") != std::string_view::npos) {
      const nlohmann::json j = nlohmann::json::parse(data, nullptr, false);
      if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].value("code", "") == "cut_by_server") {
        cut = true;  // resumed elsewhere, not passed on
        return;
      }
    }
    if (data.find("\"usage\"") != std::string_view::npos) note_usage(data);
    if (request.failover.enabled && !created) {
      const nlohmann::json j = nlohmann::json::parse(data, nullptr, false);
      if (j.is_object() && j.contains("created") && j["created"].is_number_integer()) created = j["created"].get<int64_t>();
    }
    for (const nlohmann::json& info : infos) {
      Resumed& r = resumed[info.value("i", int64_t{0})];
      for (const auto& t : info["t"]) r.ids.push_back(t.get<int32_t>());
      r.offset = info.value("o", int64_t{0});
      r.finished = info.value("f", 0) == 1;
      if (const auto c = info.find("c"); c != info.end() && c->is_number_integer() && c->get<int64_t>() >= 0)
        cached_tokens = c->get<int64_t>();
    }
    infos.clear();
    relay(raw);
  }

  // A replica's event goes to the client, its arrival noted.
  void relay(std::string_view raw) {
    pending += raw;
    if (request.added_latency) pending_at.push_back(last_byte);
  }

  // An answer's (or a stream chunk's) usage.completion_tokens.
  void note_usage(std::string_view json_text) {
    const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, false);
    if (!j.is_object()) return;
    const auto u = j.find("usage");
    if (u == j.end() || !u->is_object()) return;
    const auto c = u->find("completion_tokens");
    if (c != u->end() && c->is_number_integer() && c->get<int64_t>() >= 0) completion_tokens = c->get<int64_t>();
  }

  // What finished() reports: the usage, else the tokens the client's
  // events carried by their resume comments.
  int64_t used_completion_tokens() const {
    if (completion_tokens >= 0 || resumed.empty()) return completion_tokens;
    int64_t n = 0;
    for (const auto& [index, r] : resumed) n += static_cast<int64_t>(r.ids.size());
    return n;
  }

  void flush_event_raw() {
    if (event_raw.empty() || cut || saw_done) return;
    relay(event_raw);
    event_raw.clear();
  }

  void on_comment(std::string_view comment) {
    constexpr std::string_view kInfo = " basalt ";
    if (!request.failover.enabled || comment.substr(0, kInfo.size()) != kInfo) return;
    nlohmann::json info = nlohmann::json::parse(comment.substr(kInfo.size()), nullptr, false);
    if (info.is_object() && info.contains("t") && info["t"].is_array()) infos.push_back(std::move(info));
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
      flush_event_raw();
      const bool clean = failure == HttpFailure::kNone && events->error().empty() && !cut &&
                         (saw_done || !request.failover.enabled);
      if (clean) {
        observe_attempt(AttemptOutcome::kAnswered);
        done = true;
        final_status = 200;
        wake_client();
        return;
      }
      last_failure = replica->spec.id + ": " +
                     (cut ? std::string("cut by the server")
                          : stalled ? std::string("no byte for the stall timeout")
                                    : failure == HttpFailure::kNone
                                          ? (events->error().empty() ? "ended before [DONE]" : events->error())
                                          : std::string(http_failure_name(failure)) + " " + message);
      attempt_failed(cut ? "cut" : stalled ? "stall" : "eof");
      return;
    }
    if (failure != HttpFailure::kNone || committed) {
      // Before the head, or a resumed attempt that got no stream.
      if (failure == HttpFailure::kNone)
        last_failure = replica->spec.id + ": status " + std::to_string(status) + " " + body.substr(0, 200);
      else
        last_failure = replica->spec.id + ": " + (stalled ? std::string("no byte for the stall timeout")
                                                          : http_failure_name(failure) +
                                                                (message.empty() ? "" : " (" + message + ")"));
      attempt_failed(stalled ? "stall" : "eof",
                     failure == HttpFailure::kConnect ? AttemptOutcome::kUnreachable : AttemptOutcome::kFailed);
      return;
    }
    HttpResponse r;
    r.status = status;
    r.content_type = content_type;
    r.headers = passed_headers;
    r.body = std::move(body);
    if (retryable_status(status)) {
      last_failure = replica->spec.id + ": status " + std::to_string(status);
      const AttemptOutcome outcome = status == 429 ? AttemptOutcome::kBusy : AttemptOutcome::kUnavailable;
      observe_attempt(outcome);
      fallback = std::move(r);  // passed on if no other replica is left
      retry_from = replica;
      retry_why = outcome;
      next_attempt();
      return;
    }
    observe_attempt(AttemptOutcome::kAnswered);
    if (status == 200 && request.observe.finished && r.body.size() <= (size_t{1} << 20)) note_usage(r.body);
    note_first_byte();
    if (request.added_latency) body_at = last_byte;
    finish(std::move(r));
  }

  // The attempt failed: before the client's head another replica is
  // tried; after it the stream is resumed elsewhere while failovers last.
  void attempt_failed(const char* reason, AttemptOutcome outcome = AttemptOutcome::kFailed) {
    observe_attempt(outcome);
    if (!committed) {
      retry_from = replica;
      retry_why = outcome;
      next_attempt();
      return;
    }
    if (!request.failover.enabled || failovers >= request.failover.max_failovers) {
      end_stream_with_error();
      return;
    }
    ++failovers;
    if (request.observe.failover && replica) request.observe.failover(replica->spec, reason);
    next_attempt();
  }

  void end_stream_with_error() {
    pending += "data: " + stream_error(last_failure) + "\n\ndata: [DONE]\n\n";
    done = true;
    final_status = 200;
    wake_client();
  }

  // Every quarter of the stall timeout: an attempt silent for all of it is
  // ended (on_done then resumes the stream elsewhere).
  void watch_for_stalls() {
    stall_timer = std::make_unique<boost::asio::steady_timer>(clients.io());
    arm_stall_timer();
  }
  void arm_stall_timer() {
    stall_timer->expires_after(std::max(request.failover.stall_timeout / 4, std::chrono::milliseconds(25)));
    stall_timer->async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      if (ec) return;
      const auto self = weak.lock();
      if (!self) return;
      std::lock_guard<std::mutex> lock(self->mu);
      if (self->done || self->aborted) return;
      if (!self->stalled && Clock::now() - self->last_byte > self->request.failover.stall_timeout) {
        self->stalled = true;
        self->exchange.cancel();
      }
      self->arm_stall_timer();
    });
  }

  void finish(HttpResponse r) {
    final_status = r.status;
    head = std::move(r);
    done = true;
    wake_client();
  }

  void observe_attempt(AttemptOutcome outcome) {
    if (request.observe.attempt && replica) request.observe.attempt(*replica, outcome);
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
  std::function<void(int, const std::vector<std::string>&, int64_t)> finished;
  int status = 0;
  std::vector<std::string> tried;
  int64_t completion_tokens = -1;
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
    if (s.request.added_latency && (s.body_at || !s.pending_at.empty())) {
      // The transport writes what this pull gives as soon as it returns.
      const auto now = State::Clock::now();
      AddedLatency& added = *s.request.added_latency;
      if (s.body_at) added.body.add(now - *s.body_at);
      s.body_at.reset();
      for (const auto at : s.pending_at) added.event.add(now - at);
      s.pending_at.clear();
    }
    out.done = s.done;
    if (s.done && !s.finished_reported) {
      s.finished_reported = true;
      finished = s.request.observe.finished;
      status = s.final_status;
      tried = s.tried;
      completion_tokens = s.used_completion_tokens();
    }
  }
  if (finished) finished(status, tried, completion_tokens);
}

void ProxyProducer::abort() {
  std::function<void(int, const std::vector<std::string>&, int64_t)> finished;
  std::vector<std::string> tried;
  int64_t completion_tokens = -1;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    State& s = *state_;
    if (s.aborted || (s.done && s.head_sent && s.pending.empty() && s.finished_reported)) return;
    s.aborted = true;
    s.wake = nullptr;
    s.exchange.cancel();
    if (s.stall_timer) s.stall_timer->cancel();
    if (!s.finished_reported) {
      // The client went before its answer was out: the request ends here,
      // as nginx's 499 names it.
      s.finished_reported = true;
      finished = s.request.observe.finished;
      tried = s.tried;
      completion_tokens = s.used_completion_tokens();
    }
  }
  if (finished) finished(499, tried, completion_tokens);
}

}  // namespace basalt::router

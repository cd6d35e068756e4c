#include "server/api_server.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <fmt/format.h>
#include <random>
#include <thread>

#include "core/error.h"
#include "chat_output/tool_call_grammar.h"
#include "runtime/grammar_constraint.h"
#include "core/log.h"
#include "core/version.h"
#include "runtime/kv_events.h"
#include "server/chat_prompt.h"
#include "server/http_auth.h"
#include "server/metrics_text.h"

namespace basalt {

using json = nlohmann::json;

struct ApiServer::Shared {
  std::atomic<int64_t> in_flight{0};
  std::atomic<uint64_t> next_id{0};
  uint64_t id_salt = 0;
  bool log_requests = true;
  bool log_text = false;
  std::mutex mu;  // guards the counters and stderr lines
  std::map<std::pair<std::string, int>, uint64_t> http_requests;  // (route, status) -> count
  std::atomic<uint64_t> client_disconnects{0};
  std::atomic<uint64_t> server_cuts{0};
  // Set at the drain deadline: every live generation response ends with a
  // 503 (whole) or an error event (stream) at its next pull.
  std::atomic<bool> cutting{false};
  // Live responses' wake-ups, under mu; `beats`: the response asked for
  // heartbeats (X-Basalt-Heartbeat), so the beat thread wakes it too.
  struct Waker {
    std::function<void()> wake;
    bool beats = false;
  };
  std::map<uint64_t, Waker> wakers;
  uint64_t next_waker = 0;

  void count(const std::string& route, int status) {
    std::lock_guard<std::mutex> lock(mu);
    ++http_requests[{route, status}];
  }
  std::string new_id(const char* prefix) {
    return fmt::format("{}-{:016x}", prefix, id_salt ^ (next_id.fetch_add(1) * 0x9E3779B97F4A7C15ull));
  }
  void log(const LogLine& line) {
    if (log_requests) line.emit();
  }
  uint64_t add_waker(std::function<void()> wake, bool beats = false) {
    std::lock_guard<std::mutex> lock(mu);
    if (beats && !beat_thread.joinable() && !beat_stop) beat_thread = std::thread([this] { beat_loop(); });
    wakers.emplace(next_waker, Waker{std::move(wake), beats});
    return next_waker++;
  }
  void remove_waker(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    wakers.erase(id);
  }
  void wake_all() {
    std::vector<std::function<void()>> all;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& [id, w] : wakers) all.push_back(w.wake);
    }
    for (auto& w : all) w();
  }

  // Heartbeats (X-Basalt-Heartbeat): a thread, started with the first
  // response that asks for them, wakes those responses every kBeatTick;
  // each writes its `: hb` comment when its own interval has passed.
  static constexpr std::chrono::milliseconds kBeatTick{25};
  std::thread beat_thread;  // started under mu
  std::condition_variable beat_cv;
  bool beat_stop = false;  // under mu
  void beat_loop() {
    std::unique_lock<std::mutex> lock(mu);
    while (!beat_stop) {
      beat_cv.wait_for(lock, kBeatTick, [&] { return beat_stop; });
      std::vector<std::function<void()>> due;
      for (auto& [id, w] : wakers)
        if (w.beats) due.push_back(w.wake);
      lock.unlock();
      for (auto& w : due) w();
      lock.lock();
    }
  }
  void stop_beats() {
    {
      std::lock_guard<std::mutex> lock(mu);
      beat_stop = true;
    }
    beat_cv.notify_all();
    if (beat_thread.joinable()) beat_thread.join();
  }
};

namespace {

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

HttpResponse json_response(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

HttpResponse error_response(const ApiError& e) {
  HttpResponse r;
  r.status = e.status();
  r.body = e.body();
  if (e.status() == 429) r.headers.emplace_back("Retry-After", "1");
  return r;
}

std::string route_of(const std::string& path) {
  static const char* kKnown[] = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize",
                                 "/detokenize",     "/health",              "/ready",     "/metrics",
                                 "/version",        "/v1/kv_events"};
  for (const char* k : kKnown)
    if (path == k) return k;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kDeadline: return "length";
    case FinishReason::kCancelled: return "abort";
    case FinishReason::kError: return "error";
  }
  return "stop";
}

json stop_reason_json(const StopReason& s) {
  if (const auto* id = std::get_if<int32_t>(&s)) return *id;
  if (const auto* text = std::get_if<std::string>(&s)) return *text;
  return nullptr;
}

// One sampled output being produced.
struct Choice {
  size_t text_offset = 0;  // completions logprobs: where the next token's text starts
  RequestHandle handle;
  int index = 0;
  int prompt_index = 0;
  bool announced = false;  // stream: the first chunk (role / echo) went out
  bool finished = false;
  size_t ids_sent = 0;     // return_token_ids: ids already in a chunk's token_ids,
  bool prompt_ids_sent = false;  // and whether the prompt's went out (completions)
  size_t ids_told = 0;     // X-Basalt-Resume-Info: ids already named in a comment,
  size_t offset_told = 0;  // and the text bytes the last comment named
  int64_t cached = -1;     // prompt tokens its engine request found cached (-1: no event yet)
  size_t resumed = 0;   // basalt_resume: of ids, those the first attempt made
  std::string text;
  std::vector<int32_t> ids;
  std::vector<std::vector<TokenLogprob>> top;  // per token, when logprobs
  std::vector<float> chosen;                   // per token, when logprobs
  std::vector<PromptLogprob> prompt_scores;    // params.prompt_logprobs >= 0: from the first token's event
  FinishReason reason = FinishReason::kLength;
  StopReason stop_reason;
  std::string error;
  Usage usage;
  // Chat with tool or reasoning parsing: the text as message fields.
  std::shared_ptr<ChatOutputStream> output;
  // basalt_resume: the text the first attempt made past what the gateway
  // forwarded (sent first).
  std::string gap;
};

// The logprob of the sampled token, from the event's alternatives.
float chosen_logprob(const EngineEvent& e) {
  if (!std::isnan(e.logprob)) return e.logprob;
  for (const TokenLogprob& t : e.logprobs)
    if (t.id == e.token) return t.logprob;
  return std::nanf("");
}

class GenerationProducer : public ResponseProducer {
 public:
  GenerationProducer(std::shared_ptr<ApiServer::Shared> shared, const Tokenizer& tokenizer, ParsedRequest request,
                     std::string id, std::string header_id, std::string model, std::vector<std::string> echo_texts,
                     std::vector<int64_t> prompt_lengths, std::vector<std::vector<int32_t>> prompt_ids,
                     std::vector<Choice> choices, std::string remote, std::chrono::milliseconds heartbeat,
                     bool resume_info)
      : shared_(std::move(shared)),
        tokenizer_(tokenizer),
        request_(std::move(request)),
        id_(std::move(id)),
        header_id_(std::move(header_id)),
        model_(std::move(model)),
        echo_texts_(std::move(echo_texts)),
        prompt_lengths_(std::move(prompt_lengths)),
        prompt_ids_(std::move(prompt_ids)),
        choices_(std::move(choices)),
        remote_(std::move(remote)),
        heartbeat_(request_.stream ? heartbeat : std::chrono::milliseconds(0)),
        resume_info_(resume_info),
        created_(request_.resume && request_.resume->created ? *request_.resume->created : unix_now()),
        start_(Clock::now()),
        last_write_(start_) {}

  ~GenerationProducer() override {
    if (waker_) shared_->remove_waker(*waker_);
    cancel_rest();
  }

  void start(std::function<void()> wake) override {
    waker_ = shared_->add_waker(wake, heartbeat_.count() > 0);
    prompt_ids_streamed_ = request_.resume.has_value();  // the first attempt's first chunk had them
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& c = choices_[i];
      if (request_.echo && !request_.chat && !request_.resume)
        c.text_offset = echo_texts_[static_cast<size_t>(c.prompt_index)].size();
      if (c.handle) c.handle->set_listener(wake);
    }
  }

  void abort() override {
    if (logged_) return;  // cut by the server already
    shared_->client_disconnects.fetch_add(1);
    cancel_rest();
    finish_log(499, "client_disconnected");
  }

  void pull(Output& out) override {
    std::string sse;
    if (!resume_text_sent_) {
      resume_text_sent_ = true;
      for (Choice& c : choices_) send_resume_gap(c, sse);
    }
    for (Choice& c : choices_) {
      while (!c.finished) {
        std::optional<EngineEvent> e = c.handle->try_next_event();
        if (!e) break;
        on_event(c, *e, sse);
      }
    }
    const bool all_done = std::all_of(choices_.begin(), choices_.end(), [](const Choice& c) { return c.finished; });
    if (!all_done && shared_->cutting.load()) return cut(out, sse);
    if (!request_.stream) {
      if (!all_done) return;
      out.head = whole_response();
      out.done = true;
      finish_log(out.head->status);
      return;
    }
    if (heartbeat_.count() > 0) {
      const Clock::time_point now = Clock::now();
      if (sse.empty() && !all_done && now - last_write_ >= heartbeat_) {
        // Nothing else is due: a comment line, which SSE clients ignore,
        // tells a proxy watching for stalls that this stream is alive (a
        // long prefill, a slow step). The first one starts the stream.
        sse = ": hb\n\n";
        first_event_ = true;
      }
      if (!sse.empty() || all_done) last_write_ = now;
    }
    if (!head_sent_) {
      // The first event decides: an error before any output is a plain
      // error response, anything else starts the event stream (a resumed
      // request whose choices had all finished has no event: it is done).
      if (!first_event_ && !all_done) return;
      if (error_before_output_) {
        out.head = error_head();
        out.done = true;
        cancel_rest();
        finish_log(out.head->status);
        return;
      }
      HttpResponse head;
      head.content_type = "text/event-stream";
      head.headers.emplace_back("Cache-Control", "no-cache");
      head.headers.emplace_back("X-Request-Id", header_id_);
      head.body = std::move(sse);
      out.head = std::move(head);
      head_sent_ = true;
    } else {
      out.data = std::move(sse);
    }
    if (all_done) {
      if (request_.include_usage) out.data += sse_line(usage_chunk());
      out.data += "data: [DONE]\n\n";
      out.done = true;
      finish_log(200);
    }
  }

 private:
  // The drain deadline passed with this response unfinished: its engine
  // requests are cancelled and the client is told the server cut it off.
  void cut(Output& out, std::string& sse) {
    cancel_rest();
    shared_->server_cuts.fetch_add(1);
    const ApiError error(503, "the server is shutting down and cut this request off before it finished", {},
                         "server_error");
    // The code says what happened, so that a gateway resumes the stream
    // on another replica rather than pass the error on.
    json body = json::parse(error.body());
    body["error"]["code"] = "cut_by_server";
    if (!head_sent_) {
      out.head = error_response(error);
      out.head->body = body.dump();
      out.head->headers.emplace_back("X-Request-Id", header_id_);
    } else {
      out.data = std::move(sse) + "data: " + body.dump() + "\n\n" + "data: [DONE]\n\n";
    }
    out.done = true;
    finish_log(503, "cut_by_server");
  }

  void on_event(Choice& c, EngineEvent& e, std::string& sse) {
    first_event_ = true;
    if (c.cached < 0) c.cached = e.usage.cached_prompt_tokens;
    if (e.kind == EngineEvent::Kind::kFinished) {
      c.finished = true;
      shared_->in_flight.fetch_sub(1);
      c.reason = e.reason;
      c.stop_reason = e.stop_reason;
      c.error = e.error;
      c.usage = e.usage;
      c.text += e.text;
      if (e.reason == FinishReason::kError && c.ids.size() == c.resumed && !head_sent_) {
        error_before_output_ = true;
        if (error_.empty()) error_ = e.error;
        return;
      }
      json delta = c.output ? c.output->finish(e.text) : json();
      if (!request_.stream) return;
      if (e.reason == FinishReason::kError) {
        sse += sse_line(json{{"error", {{"message", e.error}, {"type", "server_error"}, {"code", 500}}}});
        return;
      }
      json choice = chunk_choice(c, e.text, nullptr);
      if (c.output) choice["delta"] = std::move(delta);
      choice["finish_reason"] = finish_reason(c);
      choice["stop_reason"] = stop_reason_json(e.stop_reason);
      // Without text the delta is empty, unless a parser releases what it held.
      if (request_.chat && e.text.empty() && !c.output) choice["delta"] = json::object();
      announce(c, sse);
      tell_resume_info(c, sse);
      sse += choice_chunk(c, std::move(choice));
      return;
    }
    c.ids.push_back(e.token);
    c.text += e.text;
    if (!e.prompt_logprobs.empty()) c.prompt_scores = std::move(e.prompt_logprobs);
    if (!first_token_) first_token_ = Clock::now();
    json lp = nullptr;
    if (request_.want_logprobs) {
      c.chosen.push_back(chosen_logprob(e));
      c.top.push_back(e.logprobs);
      if (request_.stream) {
        lp = logprobs_json(std::span<const int32_t>(&e.token, 1), std::span<const float>(&c.chosen.back(), 1),
                           std::span<const std::vector<TokenLogprob>>(&c.top.back(), 1), c.text_offset);
        if (!request_.chat) c.text_offset += token_text(e.token).size();
      }
    }
    json delta = c.output ? c.output->feed(e.text) : json();
    if (!request_.stream) return;
    announce(c, sse);
    if (c.output) {
      if (delta.empty() && lp.is_null()) return;  // held back (a possible marker or stop string)
      json choice = chunk_choice(c, {}, lp);
      choice["delta"] = std::move(delta);
      tell_resume_info(c, sse);
      sse += choice_chunk(c, std::move(choice));
      return;
    }
    if (e.text.empty() && lp.is_null()) return;  // held back (a possible stop string)
    tell_resume_info(c, sse);
    sse += choice_chunk(c, chunk_choice(c, e.text, lp));
  }

  // A resumed choice's text the first attempt made and the gateway did not
  // forward (past its text_offset): the first chunk of the resumed stream.
  void send_resume_gap(Choice& c, std::string& sse) {
    if (c.gap.empty()) return;
    json choice = chunk_choice(c, c.output ? std::string() : c.gap, nullptr);
    if (c.output) {
      json delta = c.output->feed(c.gap);
      if (delta.empty()) return;  // held back by the parser: it comes with later text
      choice["delta"] = std::move(delta);
    }
    announce(c, sse);  // a choice the client had no event of
    tell_resume_info(c, sse);
    sse += choice_chunk(c, std::move(choice));
    first_event_ = true;  // the stream starts with it
  }

  // X-Basalt-Resume-Info: 1 puts before each event of a choice a comment
  // with what a gateway needs to resume the stream elsewhere after it: the
  // token ids since the choice's last such comment, the bytes of the
  // choice's text produced so far (its deltas are in this event or
  // earlier ones; a chat choice's parser holds some of them back, and the
  // same text fed to a fresh parser holds back the same), whether the
  // choice ends here, and, once known, the request's cached prompt tokens.
  // SSE clients skip comments.
  void tell_resume_info(Choice& c, std::string& sse) {
    if (!resume_info_) return;
    json ids = json::array();
    for (size_t i = c.ids_told; i < c.ids.size(); ++i) ids.push_back(c.ids[i]);
    c.ids_told = c.ids.size();
    c.offset_told = c.text.size();
    write_resume_info(c, std::move(ids), c.finished, sse);
  }
  void write_resume_info(const Choice& c, json ids, bool ends, std::string& sse) {
    json info = {{"i", c.index}, {"t", std::move(ids)}, {"o", c.offset_told}, {"f", ends ? 1 : 0}};
    if (const std::optional<int64_t> cached = known_cached()) info["c"] = *cached;
    sse += ": basalt " + info.dump() + "\n";
  }

  // The prompt tokens found cached, as usage will report them (totals()),
  // once every choice's engine request has had an event (a resumed request:
  // as the first attempt's were, when the gateway said). Final once known.
  std::optional<int64_t> known_cached() {
    if (request_.resume && request_.resume->prior_cached_tokens) return request_.resume->prior_cached_tokens;
    if (known_cached_) return known_cached_;
    std::vector<int64_t> cached(prompt_lengths_.size(), -1);
    for (const Choice& c : choices_) {
      if (c.cached < 0) return std::nullopt;
      int64_t& k = cached[static_cast<size_t>(c.prompt_index)];
      k = k < 0 ? c.cached : std::min(k, c.cached);
    }
    int64_t total = 0;
    for (const int64_t k : cached) total += std::max<int64_t>(k, 0);
    known_cached_ = total;
    return known_cached_;
  }

  // OpenAI's "tool_calls" when the model stopped after calling.
  const char* finish_reason(const Choice& c) const {
    if (c.reason == FinishReason::kStop && c.output && c.output->has_tool_calls()) return "tool_calls";
    return finish_reason_name(c.reason);
  }

  // The first chunk of a choice: the assistant role (chat) or the echoed
  // prompt (completions with echo). Its resume comment names no new ids or
  // text (the chunk carries neither): it tells a gateway that the client
  // has the choice's first chunk, so a resumed stream does not send it again.
  void announce(Choice& c, std::string& sse) {
    if (c.announced) return;
    c.announced = true;
    if (resume_info_ && (request_.chat || request_.echo)) write_resume_info(c, json::array(), false, sse);
    if (request_.chat) {
      json choice = {{"index", c.index},
                     {"delta", {{"role", "assistant"}, {"content", ""}}},
                     {"logprobs", nullptr},
                     {"finish_reason", nullptr}};
      sse += choice_chunk(c, std::move(choice));
    } else if (request_.echo) {
      json lp = request_.want_logprobs ? echo_logprobs(c) : json(nullptr);
      sse += choice_chunk(
          c, chunk_choice(c, echo_texts_[static_cast<size_t>(c.prompt_index)], std::move(lp)));
    }
  }

  json chunk_choice(const Choice& c, const std::string& text, json logprobs) const {
    json choice = {{"index", c.index}, {"logprobs", std::move(logprobs)}, {"finish_reason", nullptr}};
    if (request_.chat) choice["delta"] = {{"content", text}};
    else choice["text"] = text;
    return choice;
  }

  json chunk(json choices) const {
    json j = {{"id", id_},
              {"object", request_.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", model_},
              {"choices", std::move(choices)}};
    if (request_.include_usage) j["usage"] = request_.continuous_usage ? usage_json() : json(nullptr);
    return j;
  }

  static std::string sse_line(const json& j) {
    return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
  }

  // Prompt tokens are counted once per prompt, however many samples share
  // it, and so are cached tokens: a prompt's cached count is what its
  // first-computed sample found in the cache (the smallest over its samples,
  // since the others reuse that sample's KV). So cached <= prompt always.
  struct Totals {
    int64_t prompt = 0, completion = 0, cached = 0;
    int64_t prediction_accepted = 0, prediction_rejected = 0;
  };
  Totals totals() const {
    Totals t;
    for (int64_t n : prompt_lengths_) t.prompt += n;
    std::vector<int64_t> cached(prompt_lengths_.size(), -1);
    for (const Choice& c : choices_) {
      t.completion += static_cast<int64_t>(c.ids.size());
      t.prediction_accepted += c.usage.prediction_accepted_tokens;
      t.prediction_rejected += c.usage.prediction_rejected_tokens;
      int64_t& k = cached[static_cast<size_t>(c.prompt_index)];
      k = k < 0 ? c.usage.cached_prompt_tokens : std::min(k, c.usage.cached_prompt_tokens);
    }
    for (int64_t k : cached) t.cached += std::max<int64_t>(k, 0);
    // A resumed stream reports what the first attempt found in its cache.
    if (request_.resume && request_.resume->prior_cached_tokens) t.cached = *request_.resume->prior_cached_tokens;
    return t;
  }

  json usage_json() const {
    const Totals t = totals();
    json usage = {{"prompt_tokens", t.prompt},
                  {"completion_tokens", t.completion},
                  {"total_tokens", t.prompt + t.completion},
                  {"prompt_tokens_details", {{"cached_tokens", t.cached}}}};
    // OpenAI's names; rejected counts drafts of the prediction the model did
    // not write (they cost a verification row each, not output).
    if (request_.prediction)
      usage["completion_tokens_details"] = {{"accepted_prediction_tokens", t.prediction_accepted},
                                            {"rejected_prediction_tokens", t.prediction_rejected}};
    return usage;
  }

  json usage_chunk() const {
    json j = chunk(json::array());
    j["usage"] = usage_json();
    return j;
  }

  std::string token_text(int32_t id) const {
    return tokenizer_.decode(std::span<const int32_t>(&id, 1), /*skip_special_tokens=*/false);
  }
  // How logprobs name a token: its text, or "token_id:N"
  // (return_tokens_as_token_ids; text offsets stay those of the text).
  std::string token_label(int32_t id) const {
    return request_.return_tokens_as_token_ids ? fmt::format("token_id:{}", id) : token_text(id);
  }

  // return_token_ids in a chunk: the choice's ids since its last chunk, and
  // the prompt's ids in its first (completions: in the choice; chat: beside
  // the choices, in the response's first chunk).
  void add_token_ids(Choice& c, json& choice, json& chunk_object) {
    if (!request_.return_token_ids) return;
    if (!request_.chat && c.ids_sent == 0 && !c.prompt_ids_sent) {
      choice["prompt_token_ids"] = prompt_ids_[static_cast<size_t>(c.prompt_index)];
      c.prompt_ids_sent = true;
    }
    if (request_.chat && !prompt_ids_streamed_) {
      chunk_object["prompt_token_ids"] = prompt_ids_.front();
      prompt_ids_streamed_ = true;
    }
    choice["token_ids"] = std::vector<int32_t>(c.ids.begin() + static_cast<ptrdiff_t>(c.ids_sent), c.ids.end());
    c.ids_sent = c.ids.size();
  }
  // The chunk of one choice, with its token ids when asked for.
  std::string choice_chunk(Choice& c, json choice) {
    json j = chunk({});
    add_token_ids(c, choice, j);
    j["choices"] = json::array({std::move(choice)});
    return sse_line(j);
  }

  static json bytes_of(const std::string& s) {
    json b = json::array();
    for (unsigned char ch : s) b.push_back(static_cast<int>(ch));
    return b;
  }

  static json number_or_null(float x) { return std::isnan(x) ? json(nullptr) : json(x); }

  json logprobs_json(std::span<const int32_t> ids, std::span<const float> chosen,
                     std::span<const std::vector<TokenLogprob>> top, size_t text_offset = 0) const {
    if (request_.chat) {
      json content = json::array();
      for (size_t i = 0; i < ids.size(); ++i) {
        const std::string t = token_label(ids[i]);
        json alternatives = json::array();
        for (const TokenLogprob& a : top[i]) {
          const std::string at = token_label(a.id);
          alternatives.push_back({{"token", at}, {"logprob", a.logprob}, {"bytes", bytes_of(at)}});
        }
        content.push_back({{"token", t},
                           {"logprob", number_or_null(chosen[i])},
                           {"bytes", bytes_of(t)},
                           {"top_logprobs", alternatives}});
      }
      return {{"content", content}};
    }
    json tokens = json::array(), token_logprobs = json::array(), tops = json::array(), offsets = json::array();
    size_t offset = text_offset;
    for (size_t i = 0; i < ids.size(); ++i) {
      tokens.push_back(token_label(ids[i]));
      token_logprobs.push_back(number_or_null(chosen[i]));
      json alternatives = json::object();
      for (const TokenLogprob& a : top[i]) alternatives[token_label(a.id)] = a.logprob;
      tops.push_back(request_.params.logprobs > 0 ? alternatives : json(nullptr));
      offsets.push_back(offset);
      offset += token_text(ids[i]).size();
    }
    return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  // Completions with echo and logprobs: the logprobs of the prompt's
  // tokens, as those of output tokens (text offsets from the prompt's
  // start), the first token's null. A prompt whose scores are missing (a
  // choice that failed first) has null logprobs throughout.
  json echo_logprobs(const Choice& c) const {
    const std::vector<int32_t>& ids = prompt_ids_[static_cast<size_t>(c.prompt_index)];
    const bool scored = c.prompt_scores.size() + 1 == ids.size();
    std::vector<float> chosen(ids.size(), std::nanf(""));
    std::vector<std::vector<TokenLogprob>> top(ids.size());
    for (size_t i = 1; i < ids.size() && scored; ++i) {
      const PromptLogprob& s = c.prompt_scores[i - 1];
      chosen[i] = s.logprob;
      top[i].assign(s.top.begin(), s.top.begin() + std::min<ptrdiff_t>(std::ssize(s.top),
                                                                       request_.params.logprobs));
    }
    json lp = logprobs_json(ids, chosen, top, 0);
    if (!lp["top_logprobs"].empty()) lp["top_logprobs"][0] = nullptr;
    return lp;
  }

  // vLLM's prompt_logprobs: null for the first prompt token, then per token
  // an object keyed by token id of {logprob, rank, decoded_token}: the
  // prompt token's own and its request_.prompt_logprobs alternatives.
  json prompt_logprobs_json(const Choice& c) const {
    json out = json::array({nullptr});
    for (const PromptLogprob& s : c.prompt_scores) {
      json entry = json::object();
      const size_t n =
          std::min(s.top.size(), static_cast<size_t>(std::max(request_.prompt_logprobs, 0)));
      for (size_t j = 0; j < n; ++j)
        entry[std::to_string(s.top[j].id)] = {{"logprob", s.top[j].logprob},
                                              {"rank", j + 1},
                                              {"decoded_token", token_label(s.top[j].id)}};
      entry[std::to_string(s.token)] = {{"logprob", number_or_null(s.logprob)},
                                        {"rank", s.rank},
                                        {"decoded_token", token_label(s.token)}};
      out.push_back(std::move(entry));
    }
    return out;
  }

  // Two completions logprobs objects as one: a's tokens, then b's.
  static json joined_logprobs(json a, const json& b) {
    for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
      for (const json& v : b[key]) a[key].push_back(v);
    return a;
  }

  HttpResponse error_head() const {
    // Engine errors before any output are about the request (too long for
    // the pool, a bad id): the client's to fix.
    HttpResponse r = error_response(ApiError(400, error_.empty() ? "request failed" : error_));
    r.headers.emplace_back("X-Request-Id", header_id_);
    return r;
  }

  HttpResponse whole_response() const {
    for (const Choice& c : choices_)
      if (c.reason == FinishReason::kError) {
        if (c.ids.empty()) return error_head();
        HttpResponse r = error_response(ApiError(500, c.error, {}, "server_error"));
        r.headers.emplace_back("X-Request-Id", header_id_);
        return r;
      }
    json choices = json::array();
    for (const Choice& c : choices_) {
      std::string text = c.text;
      const std::string& echo = request_.echo ? echo_texts_[static_cast<size_t>(c.prompt_index)] : std::string();
      json lp = nullptr;
      if (request_.want_logprobs) lp = logprobs_json(c.ids, c.chosen, c.top, echo.size());
      if (request_.want_logprobs && request_.echo && !request_.chat)
        lp = joined_logprobs(echo_logprobs(c), lp);
      json choice = {{"index", c.index},
                     {"logprobs", lp},
                     {"finish_reason", finish_reason(c)},
                     {"stop_reason", stop_reason_json(c.stop_reason)}};
      if (request_.prompt_logprobs >= 0 && !request_.chat)
        choice["prompt_logprobs"] = prompt_logprobs_json(c);
      if (request_.return_token_ids) {
        choice["token_ids"] = c.ids;
        if (!request_.chat) choice["prompt_token_ids"] = prompt_ids_[static_cast<size_t>(c.prompt_index)];
      }
      if (request_.chat && c.output) {
        json message = c.output->message();
        if (!echo.empty())
          message["content"] = echo + (message["content"].is_string() ? message["content"].get<std::string>() : "");
        choice["message"] = std::move(message);
      } else if (request_.chat) {
        choice["message"] = {{"role", "assistant"}, {"content", echo + text}};
      } else {
        choice["text"] = echo + text;
      }
      choices.push_back(std::move(choice));
    }
    json body = {{"id", id_},
                 {"object", request_.chat ? "chat.completion" : "text_completion"},
                 {"created", created_},
                 {"model", model_},
                 {"choices", choices},
                 {"usage", usage_json()}};
    if (request_.return_token_ids && request_.chat) body["prompt_token_ids"] = prompt_ids_.front();
    if (request_.prompt_logprobs >= 0 && request_.chat)
      body["prompt_logprobs"] = prompt_logprobs_json(choices_.front());
    HttpResponse r = json_response(200, body);
    r.headers.emplace_back("X-Request-Id", header_id_);
    return r;
  }

  // Stops listening and cancels every choice still running.
  void cancel_rest() {
    for (Choice& c : choices_) {
      if (!c.handle) continue;  // resumed as finished: never submitted
      c.handle->set_listener({});
      if (!c.finished) {
        c.handle->cancel();
        c.finished = true;
        shared_->in_flight.fetch_sub(1);
      }
    }
  }

  // One line per request, once: how it ended (completed, client_disconnected,
  // cut_by_server, error), its sizes and its timings. ttft_s only when a
  // token was produced.
  void finish_log(int status, const char* outcome = nullptr) {
    if (logged_) return;
    logged_ = true;
    const Totals t = totals();
    const double total = std::chrono::duration<double>(Clock::now() - start_).count();
    if (outcome == nullptr) outcome = status == 200 ? "completed" : "error";
    LogLine line("request", status >= 500 ? LogLevel::kWarning : LogLevel::kInfo);
    line.add("id", id_);
    if (header_id_ != id_) line.add("client_request_id", header_id_);
    line.add("remote", remote_)
        .add("endpoint", request_.chat ? "chat" : "completions")
        .add("status", status)
        .add("outcome", outcome)
        .add("stream", request_.stream)
        .add("choices", static_cast<int64_t>(choices_.size()))
        .add("prompt_tokens", t.prompt)
        .add("cached_tokens", t.cached)
        .add("completion_tokens", t.completion);
    if (first_token_) line.add("ttft_s", std::chrono::duration<double>(*first_token_ - start_).count());
    line.add("total_s", total);
    if (!request_.user.empty()) line.add("user", request_.user);
    if (shared_->log_text) {
      for (const Choice& c : choices_) line.add(fmt::format("output[{}]", c.index), c.text);
    }
    shared_->count(request_.chat ? "/v1/chat/completions" : "/v1/completions", status);
    shared_->log(line);
  }

  std::shared_ptr<ApiServer::Shared> shared_;
  const Tokenizer& tokenizer_;
  ParsedRequest request_;
  std::string id_;         // the response's id
  std::string header_id_;  // X-Request-Id: the client's id, or id_
  std::optional<uint64_t> waker_;
  std::string model_;
  std::vector<std::string> echo_texts_;
  std::vector<int64_t> prompt_lengths_;
  std::vector<std::vector<int32_t>> prompt_ids_;  // per prompt: return_token_ids, or echo with logprobs
  bool prompt_ids_streamed_ = false;               // chat streams: sent in the first chunk
  std::vector<Choice> choices_;
  std::string remote_;
  std::chrono::milliseconds heartbeat_;  // X-Basalt-Heartbeat; 0: none
  bool resume_info_;                     // X-Basalt-Resume-Info: 1
  int64_t created_;
  Clock::time_point start_;
  Clock::time_point last_write_;  // bytes last given to the transport
  std::optional<Clock::time_point> first_token_;
  bool first_event_ = false;
  bool error_before_output_ = false;
  std::string error_;
  bool head_sent_ = false;
  bool logged_ = false;
  bool resume_text_sent_ = false;
  std::optional<int64_t> known_cached_;  // known_cached(), once every choice had an event
};

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

// One KV-event batch as an SSE event (docs/SERVER.md, "KV events").
std::string kv_event_sse(const KvEventBatch& batch) {
  json events = json::array();
  for (const KvEvent& e : batch.events) {
    json hashes = json::array();
    for (uint64_t h : e.block_hashes) hashes.push_back(hex64(h));
    json item = {{"type", e.kind == KvEvent::Kind::kStored ? "stored" : "removed"},
                 {"namespace", hex64(e.ns)},
                 {"block_hashes", std::move(hashes)}};
    if (e.kind == KvEvent::Kind::kStored) {
      item["parent_block_hash"] = e.parent_hash == 0 ? json(nullptr) : json(hex64(e.parent_hash));
      item["token_ids"] = e.token_ids;
    }
    events.push_back(std::move(item));
  }
  const json body = {{"seq", batch.seq},
                     {"snapshot", batch.snapshot},
                     {"block_size", batch.block_size},
                     {"events", std::move(events)}};
  return "data: " + body.dump() + "\n\n";
}

// GET /v1/kv_events: the engine's KV events as server-sent events, until the
// client leaves, the server drains, or the client reads too slowly (then an
// error event ends the stream, and the client subscribes again).
class KvEventsProducer : public ResponseProducer {
 public:
  static constexpr size_t kMaxQueuedBytes = 64u << 20;

  KvEventsProducer(std::shared_ptr<ApiServer::Shared> shared, EngineClient& engine, std::string request_id)
      : shared_(std::move(shared)), engine_(engine), request_id_(std::move(request_id)), state_(std::make_shared<State>()) {}
  ~KvEventsProducer() override { stop(); }

  void start(std::function<void()> wake) override {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->wake = wake;
    }
    waker_ = shared_->add_waker(wake);
    subscription_ = engine_.subscribe_kv_events([state = state_](const KvEventBatch& batch) {
      std::function<void()> wake;
      {
        std::lock_guard<std::mutex> lock(state->mu);
        if (state->overflow) return;
        if (state->queued.size() > kMaxQueuedBytes) {
          state->overflow = true;
        } else {
          state->queued += kv_event_sse(batch);
        }
        wake = state->wake;
      }
      if (wake) wake();
    });
  }

  void pull(Output& out) override {
    std::string data;
    bool overflow = false;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      data.swap(state_->queued);
      overflow = state_->overflow;
    }
    if (!head_sent_) {
      HttpResponse head;
      head.content_type = "text/event-stream";
      head.headers.emplace_back("Cache-Control", "no-cache");
      if (!request_id_.empty()) head.headers.emplace_back("X-Request-Id", request_id_);
      head.body = std::move(data);
      out.head = std::move(head);
      head_sent_ = true;
    } else {
      out.data = std::move(data);
    }
    if (overflow || shared_->cutting.load()) {
      const char* why = overflow ? "the client read KV events too slowly; subscribe again"
                                 : "the server is shutting down";
      out.data += "data: " + ApiError(503, why, {}, "server_error").body() + "\n\n";
      out.done = true;
      stop();
    }
  }

  void abort() override { stop(); }

 private:
  struct State {
    std::mutex mu;
    std::string queued;
    bool overflow = false;
    std::function<void()> wake;
  };

  void stop() {
    if (subscription_ != 0) engine_.unsubscribe_kv_events(std::exchange(subscription_, 0));
    if (waker_) shared_->remove_waker(*std::exchange(waker_, std::nullopt));
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->wake = nullptr;
  }

  std::shared_ptr<ApiServer::Shared> shared_;
  EngineClient& engine_;
  std::string request_id_;
  std::shared_ptr<State> state_;
  uint64_t subscription_ = 0;
  std::optional<uint64_t> waker_;
  bool head_sent_ = false;
};

}  // namespace

ApiServer::ApiServer(EngineClient& engine, const Tokenizer& tokenizer, const TokenizerConfig& tokenizer_config,
                     ApiServerOptions options)
    : engine_(engine),
      tokenizer_(tokenizer),
      tokenizer_config_(tokenizer_config),
      options_(std::move(options)),
      shared_(std::make_shared<Shared>()),
      created_(unix_now()) {
  const int64_t model_len = engine_.model_config().max_position_embeddings;
  BASALT_CHECK(options_.max_model_len <= 0 || model_len <= 0 || options_.max_model_len <= model_len,
               "--max-model-len {} is above the model's context length ({}, max_position_embeddings in "
               "config.json); positions past it were never trained",
               options_.max_model_len, model_len);
  max_model_len_ = options_.max_model_len > 0 ? options_.max_model_len : model_len;
  BASALT_CHECK(max_model_len_ > 1, "the model's context length is unknown; pass --max-model-len");
  max_choices_per_request_ = options_.max_n > 0 ? options_.max_n : std::max(1, options_.max_running / 2);
  max_choices_per_request_ = std::min<int64_t>(max_choices_per_request_, int64_t{options_.limits.max_n} * 4);
  std::random_device rd;
  shared_->id_salt = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  shared_->log_requests = options_.log_requests;
  shared_->log_text = options_.log_text;
  if (options_.tool_call_parser == "auto") tool_format_ = detect_tool_call_format(tokenizer_config_.chat_template);
  else if (options_.tool_call_parser != "none" && !options_.tool_call_parser.empty())
    tool_format_ = parse_tool_call_format(options_.tool_call_parser);
  if (!options_.reasoning_parser.empty()) reasoning_format_ = parse_reasoning_format(options_.reasoning_parser);
}

ApiServer::~ApiServer() { shared_->stop_beats(); }

GrammarCache& ApiServer::grammars() {
  // The vocabulary's token bytes are gathered on the first structured
  // request, not at start (most servers never need them).
  std::call_once(grammars_once_, [&] {
    grammars_ = std::make_unique<GrammarCache>(TokenVocabulary::from_tokenizer(
        tokenizer_, static_cast<int32_t>(engine_.model_config().vocab_size), engine_.model_config().eos_token_ids));
  });
  return *grammars_;
}

int64_t ApiServer::in_flight() const { return shared_->in_flight.load(); }

bool ApiServer::authorized(const HttpRequest& request) const { return bearer_authorized(request, options_.api_keys); }

HandlerResult ApiServer::handle(HttpRequest& request) {
  const std::string& path = request.path;
  const std::string route = route_of(path);
  std::string client_id;
  if (auto h = request.header("x-request-id"); h && valid_client_id(*h)) client_id = std::string(*h);
  auto answer = [&](HttpResponse r) {
    shared_->count(route, r.status);
    if (!client_id.empty()) r.headers.emplace_back("X-Request-Id", client_id);
    if (route != "/metrics" && route != "/health" && route != "/ready") {
      LogLine line("request", r.status >= 500 ? LogLevel::kWarning : LogLevel::kInfo);
      if (!client_id.empty()) line.add("client_request_id", client_id);
      line.add("remote", request.remote)
          .add("method", request.method)
          .add("path", route)
          .add("status", r.status)
          .add("body_bytes", static_cast<int64_t>(request.body.size()));
      shared_->log(line);
    }
    return HandlerResult{std::move(r), nullptr};
  };
  // HEAD is answered wherever GET is (the transport sends no body).
  auto need = [&](const char* method) {
    return request.method == method || (std::string_view(method) == "GET" && request.method == "HEAD");
  };
  try {
    if (path == "/health") {
      if (!need("GET")) throw ApiError(405, "use GET or HEAD");
      return answer(json_response(200, {{"status", "ok"}}));
    }
    if (path == "/ready") {
      if (!need("GET")) throw ApiError(405, "use GET or HEAD");
      if (!ready_ || draining_)
        return answer(json_response(503, {{"status", draining_ ? "draining" : "loading"}}));
      return answer(json_response(200, {{"status", "ready"}}));
    }
    if (path == "/metrics") {
      if (!need("GET")) throw ApiError(405, "use GET");
      HttpResponse r;
      r.content_type = "text/plain; version=0.0.4; charset=utf-8";
      r.body = metrics_text();
      return answer(std::move(r));
    }
    if (path == "/version") {
      if (!need("GET")) throw ApiError(405, "use GET");
      return answer(json_response(200, {{"version", std::string(kBasaltVersion)}}));
    }
    const bool api = path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize";
    if (!api) throw ApiError(404, fmt::format("no route for {} {}", request.method, path), {}, "not_found_error");
    if (!authorized(request))
      throw ApiError(401, "a valid API key is required (Authorization: Bearer <key>)", {}, "authentication_error");
    if (path == "/v1/models") {
      if (!need("GET")) throw ApiError(405, "use GET");
      return answer(models());
    }
    if (path == "/v1/kv_events") {
      if (request.method != "GET") throw ApiError(405, "use GET");
      shared_->count(route, 200);
      return HandlerResult{{}, std::make_unique<KvEventsProducer>(shared_, engine_, client_id)};
    }
    if (path.rfind("/v1/models/", 0) == 0) {
      if (!need("GET")) throw ApiError(405, "use GET");
      return answer(model(path.substr(std::string_view("/v1/models/").size())));
    }
    if (path == "/v1/completions" || path == "/v1/chat/completions") {
      if (!need("POST")) throw ApiError(405, "use POST");
      HandlerResult result = generate(request, path == "/v1/chat/completions", client_id);
      if (!result.producer) return answer(std::move(result.response));
      return result;
    }
    if (path == "/tokenize") {
      if (!need("POST")) throw ApiError(405, "use POST");
      return answer(tokenize(request));
    }
    if (path == "/detokenize") {
      if (!need("POST")) throw ApiError(405, "use POST");
      return answer(detokenize(request));
    }
    throw ApiError(404, fmt::format("no route for {} {}", request.method, path), {}, "not_found_error");
  } catch (const ApiError& e) {
    return answer(error_response(e));
  } catch (const Error& e) {
    return answer(error_response(ApiError(400, e.what())));
  }
}

void ApiServer::note_rejection(int status, const std::string& remote, const std::string& method,
                               const std::string& path, const std::string& reason) {
  const std::string route = path.empty() ? "other" : route_of(path);
  shared_->count(route, status);
  shared_->log(transport_rejection_line({status, remote, method, path, reason}, route));
}

void ApiServer::cut_in_flight() {
  shared_->cutting.store(true);
  shared_->wake_all();
}

uint64_t ApiServer::server_cuts() const { return shared_->server_cuts.load(); }

json ApiServer::model_object() const {
  return {{"id", options_.served_model_name},
          {"object", "model"},
          {"created", created_},
          {"owned_by", "basalt"},
          {"root", options_.served_model_name},
          {"parent", nullptr},
          {"max_model_len", max_model_len_}};
}

HttpResponse ApiServer::models() const {
  json data = json::array();
  data.push_back(model_object());
  return json_response(200, {{"object", "list"}, {"data", data}});
}

HttpResponse ApiServer::model(const std::string& id) const {
  if (id != options_.served_model_name)
    throw ApiError(404, fmt::format("The model `{}` does not exist.", id), "model", "not_found_error");
  return json_response(200, model_object());
}

std::string ApiServer::render_chat(const ParsedRequest& r) const {
  return render_chat_prompt(r, tokenizer_config_);
}

std::optional<ToolCallFormat> ApiServer::tool_format_for(const ParsedRequest& r) const {
  // A request that brings its own chat template brings its own tool-call
  // format, unless the server was told one (or the template shows none).
  if (options_.tool_call_parser == "auto" && !r.chat_template.empty())
    if (const std::optional<ToolCallFormat> own = detect_tool_call_format(r.chat_template)) return own;
  return tool_format_;
}

ChatOutputOptions ApiServer::chat_output_options(const ParsedRequest& r, const std::string& prompt) const {
  ChatOutputOptions o;
  const std::optional<ToolCallFormat> tool_format = tool_format_for(r);
  if (r.tool_choice != ParsedRequest::ToolChoice::kNone && tool_format) {
    o.tool_format = tool_format;
    o.tools = r.tools;
  }
  if (reasoning_format_ && r.separate_reasoning) {
    o.reasoning_format = reasoning_format_;
    o.starts_in_reasoning = prompt_opens_reasoning(prompt);
    o.include_reasoning = r.include_reasoning;
    o.stream_reasoning = r.stream_reasoning;
  }
  return o;
}

namespace {

// vLLM's bad_words -> bad_words_token_ids (SamplingParams.update_from_tokenizer):
// each word with its leading spaces stripped, tokenized alone, and after
// one space where that spelling starts with another token and has as many
// tokens (so that a word in mid-sentence is caught where its tokenizer puts
// the space inside the first token).
std::vector<std::vector<int32_t>> bad_words_token_ids(const Tokenizer& tokenizer,
                                                      const std::vector<std::string>& words) {
  std::vector<std::vector<int32_t>> out;
  for (const std::string& word : words) {
    const std::string stripped = word.substr(word.find_first_not_of(" \t\n\r\f\v"));
    std::vector<int32_t> alone = tokenizer.encode(stripped, false);
    if (alone.empty()) continue;
    std::vector<int32_t> spaced = tokenizer.encode(" " + stripped, false);
    const bool other = !spaced.empty() && spaced.front() != alone.front() && spaced.size() == alone.size();
    out.push_back(std::move(alone));
    if (other) out.push_back(std::move(spaced));
  }
  return out;
}

// basalt_resume: each choice of the request as a request of its own, sample
// i % n of prompt i / n drawing with sample_seed(seed, i % n) as submit_n
// gives it, continuing from the output the first attempt made (a choice
// that had finished is kept, not run). The text the continuation's ids make
// beyond the client's text_offset is the choice's gap, sent first; a chat
// parser is fed the text before the offset, so it holds back what the first
// attempt's held back. Each takes the request's prediction tokens as given.
// Throws ApiError (400) for an index, id or offset
// the request cannot have, with nothing left submitted.
std::vector<Choice> resume_choices(EngineClient& engine, const Tokenizer& tokenizer, const ParsedRequest& r,
                                   const std::vector<std::vector<int32_t>>& prompts,
                                   const std::shared_ptr<const TokenMasker>& grammar,
                                   const std::vector<int32_t>& prediction, const ChatOutputOptions* parsing) {
  const int n = r.params.n;
  const int samples = static_cast<int>(prompts.size()) * n;
  const int64_t vocab = engine.model_config().vocab_size;
  std::map<int, const ParsedRequest::ResumedChoice*> given;
  for (const ParsedRequest::ResumedChoice& rc : r.resume->choices) {
    if (rc.index >= samples)
      throw ApiError(400, fmt::format("'basalt_resume.choices' index {} is past this request's {} choices", rc.index,
                                      samples),
                     "basalt_resume");
    for (const int32_t id : rc.output_ids)
      if (id >= vocab)
        throw ApiError(400, fmt::format("'basalt_resume.choices' index {}: {} is not a token id of this model",
                                        rc.index, id),
                       "basalt_resume");
    given[rc.index] = &rc;
  }
  std::vector<Choice> choices;
  try {
    for (int i = 0; i < samples; ++i) {
      Choice c;
      c.index = i;
      c.prompt_index = i / n;
      if (parsing != nullptr) c.output = std::make_shared<ChatOutputStream>(*parsing);
      const auto found = given.find(i);
      const ParsedRequest::ResumedChoice* rc = found == given.end() ? nullptr : found->second;
      // No role delta, no echo when the first attempt sent them (a choice
      // not listed included, as before "announced" existed).
      c.announced = rc == nullptr || rc->announced;
      if (rc != nullptr) c.ids = rc->output_ids;
      c.resumed = c.ids_told = c.ids_sent = c.ids.size();
      c.prompt_ids_sent = c.announced;
      if (rc != nullptr && rc->finished) {
        c.finished = true;  // counted in usage, not run again
        choices.push_back(std::move(c));
        continue;
      }
      EngineRequest e;
      e.prompt = prompts[static_cast<size_t>(i / n)];
      e.params = r.params;
      e.params.n = 1;
      e.params.seed = sample_seed(*r.params.seed, i % n);
      e.cache_namespace = kv_cache_namespace(r.cache_salt);
      e.priority = r.priority;
      if (grammar) e.constraint = std::make_shared<GrammarConstraint>(grammar, &tokenizer);
      e.resume_output = c.ids;
      e.prediction = prediction;
      c.handle = engine.submit(std::move(e));
      choices.push_back(std::move(c));
      Choice& added = choices.back();
      const std::string& text = added.handle->resumed_text();
      const auto offset = static_cast<size_t>(rc != nullptr ? rc->text_offset : 0);
      if (offset > text.size())
        throw ApiError(400,
                       fmt::format("'basalt_resume.choices' index {}: text_offset {} is past the {} bytes of text "
                                   "its output_token_ids make",
                                   i, offset, text.size()),
                       "basalt_resume");
      added.text = text;
      added.text_offset = text.size();
      added.offset_told = offset;
      if (added.output) (void)added.output->feed(text.substr(0, offset));
      added.gap = text.substr(offset);
    }
  } catch (...) {
    for (Choice& c : choices)
      if (c.handle) c.handle->cancel();
    throw;
  }
  return choices;
}

// X-Basalt-Heartbeat: milliseconds between `: hb` comments on a stream
// with nothing else to send (a gateway's stall detection asks for them).
std::chrono::milliseconds heartbeat_of(const HttpRequest& request) {
  const std::optional<std::string_view> h = request.header("x-basalt-heartbeat");
  if (!h) return std::chrono::milliseconds(0);
  int64_t ms = -1;
  if (!h->empty() && h->size() <= 6 && h->find_first_not_of("0123456789") == std::string_view::npos)
    ms = std::stoll(std::string(*h));
  if (ms < 100 || ms > 60000)
    throw ApiError(400, fmt::format("X-Basalt-Heartbeat: expected milliseconds from 100 to 60000, got '{}'", *h));
  return std::chrono::milliseconds(ms);
}

}  // namespace

HandlerResult ApiServer::generate(HttpRequest& request, bool chat, const std::string& header_id) {
  if (draining_) throw ApiError(503, "the server is shutting down", {}, "server_error");
  const std::chrono::milliseconds heartbeat = heartbeat_of(request);
  ProtocolLimits limits = options_.limits;
  ParsedRequest r = chat ? parse_chat_request(request.body, limits) : parse_completion_request(request.body, limits);
  if (!r.model.empty() && r.model != options_.served_model_name)
    throw ApiError(404, fmt::format("The model `{}` does not exist.", r.model), "model", "not_found_error");

  const int64_t samples = static_cast<int64_t>(chat ? 1 : r.prompts.size()) * r.params.n;
  if (samples > max_choices_per_request_)
    throw ApiError(400,
                   fmt::format("this request asks for {} samples ('n' times the prompts); this server allows {} per "
                               "request (--max-n), so that one request cannot take every running slot",
                               samples, max_choices_per_request_),
                   "n");

  // Prompts as ids.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> echo_texts;
  ChatOutputOptions chat_output;
  if (chat) {
    const std::string text = render_chat(r);
    chat_output = chat_output_options(r, text);
    // Mistral's [TOOL_CALLS] is a special token: the parser must see it.
    if (chat_output.tool_format == ToolCallFormat::kMistral) r.params.skip_special_tokens = false;
    prompts.push_back(tokenizer_.encode(text, r.add_special_tokens));
    echo_texts.push_back(r.echo && !r.messages.back()["content"].is_null() &&
                                 r.messages.back().value("role", "") == "assistant"
                             ? r.messages.back()["content"].get<std::string>()
                             : std::string());
  } else {
    for (const PromptInput& p : r.prompts) {
      if (const auto* text = std::get_if<std::string>(&p)) {
        prompts.push_back(tokenizer_.encode(*text, r.add_special_tokens));
        echo_texts.push_back(*text);
      } else {
        const auto& ids = std::get<std::vector<int32_t>>(p);
        for (int32_t id : ids)
          if (id >= tokenizer_.vocab_size() || id >= engine_.model_config().vocab_size)
            throw ApiError(400, fmt::format("token id {} is outside the vocabulary", id), "prompt");
        prompts.push_back(ids);
        echo_texts.push_back(r.echo ? tokenizer_.decode(ids, false) : std::string());
      }
    }
  }
  for (auto& ids : prompts) truncate_prompt(ids, r.truncate_prompt_tokens, max_model_len_);
  const int64_t capacity = engine_.kv_capacity();
  std::vector<int64_t> prompt_lengths;
  for (const auto& ids : prompts) {
    const int64_t n = static_cast<int64_t>(ids.size());
    if (n == 0) throw ApiError(400, "the prompt is empty after tokenization", "prompt");
    if (n >= max_model_len_)
      throw ApiError(400,
                     fmt::format("This model's maximum context length is {} tokens. However, your prompt has {} "
                                 "tokens. Please reduce the length of the prompt.",
                                 max_model_len_, n),
                     chat ? "messages" : "prompt");
    const int64_t room = std::min(max_model_len_, capacity) - n;
    if (!r.max_tokens_given) {
      r.params.max_tokens = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(r.params.max_tokens, room)));
    } else if (n + r.params.max_tokens > max_model_len_) {
      throw ApiError(400,
                     fmt::format("This model's maximum context length is {} tokens. However, you requested {} "
                                 "tokens ({} in the prompt, {} for the completion). Please reduce the length of "
                                 "the prompt or the completion.",
                                 max_model_len_, n + r.params.max_tokens, n, r.params.max_tokens),
                     chat ? "max_completion_tokens" : "max_tokens");
    }
    prompt_lengths.push_back(n);
  }
  r.params.bad_words_ids = bad_words_token_ids(tokenizer_, r.bad_words);
  try {
    SamplingParams check = r.params;
    check.validate(engine_.model_config().vocab_size, options_.limits.max_logprobs);
  } catch (const Error& e) {
    throw ApiError(400, e.what());
  }
  const bool forced_call =
      r.tool_choice == ParsedRequest::ToolChoice::kRequired || r.tool_choice == ParsedRequest::ToolChoice::kNamed;
  if (chat && forced_call) {
    // The call is forced by a grammar of the model's own tool-call format,
    // its arguments by each function's parameter schema.
    const std::optional<ToolCallFormat> tool_format = tool_format_for(r);
    if (!tool_format)
      throw ApiError(400,
                     "'tool_choice' forces a tool call, but this server has no tool-call format for the model "
                     "(start it with --tool-call-parser NAME; none was detected from the chat template)",
                     "tool_choice");
    StructuredOutputSpec spec;
    spec.kind = StructuredOutputSpec::Kind::kGrammar;
    try {
      // A reasoning model reasons first; the grammar starts the calls
      // where its reasoning parser ends the reasoning.
      std::optional<ReasoningPrefix> reasoning;
      if (chat_output.reasoning_format)
        reasoning = ReasoningPrefix{*chat_output.reasoning_format, chat_output.starts_in_reasoning};
      spec.text = tool_call_grammar(*tool_format, r.tools,
                                    r.tool_choice == ParsedRequest::ToolChoice::kNamed ? ToolChoiceMode::kNamed
                                                                                        : ToolChoiceMode::kRequired,
                                    r.tool_choice_name, r.parallel_tool_calls, reasoning);
    } catch (const Error& e) {
      throw ApiError(400, fmt::format("'tools': {}", e.what()), "tools");
    }
    r.structured = std::move(spec);
    r.structured_param = "tools";
  }
  std::shared_ptr<const TokenMasker> grammar;
  if (r.structured) {
    try {
      grammar = grammars().get(*r.structured);
    } catch (const Error& e) {
      throw ApiError(400, fmt::format("'{}': {}", r.structured_param, e.what()), r.structured_param);
    }
  }

  // The prediction's tokens, spelled as the model would write the text.
  std::vector<int32_t> prediction;
  if (r.prediction) {
    prediction = tokenizer_.encode(*r.prediction, /*add_special_tokens=*/false);
    if (static_cast<int64_t>(prediction.size()) > max_model_len_)
      throw ApiError(400,
                     fmt::format("'prediction' is {} tokens, longer than the model's context length ({})",
                                 prediction.size(), max_model_len_),
                     "prediction");
  }

  // Admission control: the engine's queue is bounded here.
  const int64_t wanted = static_cast<int64_t>(prompts.size()) * r.params.n;
  const int64_t limit = static_cast<int64_t>(options_.max_running) + options_.max_queue;
  if (shared_->in_flight.fetch_add(wanted) + wanted > limit) {
    shared_->in_flight.fetch_sub(wanted);
    throw ApiError(429, "the server is at capacity; retry shortly", {}, "rate_limit_error");
  }

  // The n samples of a prompt share its prefill through the radix cache;
  // sample i draws with sample_seed(seed, i).
  std::vector<Choice> choices;
  if (r.resume) {
    try {
      const bool parsed = chat && (chat_output.tool_format || chat_output.reasoning_format);
      choices = resume_choices(engine_, tokenizer_, r, prompts, grammar, prediction, parsed ? &chat_output : nullptr);
    } catch (...) {
      shared_->in_flight.fetch_sub(wanted);
      throw;
    }
  }
  int index = 0;
  for (size_t p = 0; p < prompts.size() && !r.resume; ++p) {
    EngineRequest e;
    e.prompt = prompts[p];
    e.params = r.params;
    e.cache_namespace = kv_cache_namespace(r.cache_salt);
    e.priority = r.priority;
    e.prediction = prediction;
    if (grammar) e.constraint = std::make_shared<GrammarConstraint>(grammar, &tokenizer_);
    for (RequestHandle& handle : engine_.submit_n(std::move(e), r.params.n)) {
      Choice c;
      c.index = index++;
      c.prompt_index = static_cast<int>(p);
      c.handle = std::move(handle);
      if (chat && (chat_output.tool_format || chat_output.reasoning_format))
        c.output = std::make_shared<ChatOutputStream>(chat_output);
      choices.push_back(std::move(c));
    }
  }
  // Normally 0; a resumed request's finished choices are not submitted.
  const auto submitted = std::count_if(choices.begin(), choices.end(), [](const Choice& c) { return c.handle != nullptr; });
  shared_->in_flight.fetch_add(static_cast<int64_t>(submitted) - wanted);
  // vLLM's convention: the response id is the prefix and the client's id
  // (X-Request-Id, else the body's request_id), which is echoed as is.
  std::string client_id = header_id;
  if (client_id.empty() && valid_client_id(r.request_id)) client_id = r.request_id;
  const char* prefix = chat ? "chatcmpl" : "cmpl";
  const std::string id = client_id.empty() ? shared_->new_id(prefix) : fmt::format("{}-{}", prefix, client_id);
  const bool keep_prompt_ids = r.return_token_ids || (r.echo && r.want_logprobs && !chat);
  auto producer = std::make_unique<GenerationProducer>(shared_, tokenizer_, std::move(r), id,
                                                       client_id.empty() ? id : client_id, options_.served_model_name,
                                                       std::move(echo_texts), std::move(prompt_lengths),
      keep_prompt_ids ? std::move(prompts) : std::vector<std::vector<int32_t>>{},
                                                       std::move(choices), request.remote, heartbeat,
                                                       request.header("x-basalt-resume-info") == "1");
  return HandlerResult{{}, std::move(producer)};
}

HttpResponse ApiServer::tokenize(const HttpRequest& request) {
  const json b = parse_json_object(request.body);
  std::vector<int32_t> ids;
  if (b.contains("messages")) {
    ParsedRequest r = parse_chat_request(request.body, options_.limits);
    ids = tokenizer_.encode(render_chat(r), r.add_special_tokens);
  } else {
    auto it = b.find("prompt");
    if (it == b.end() || !it->is_string()) throw ApiError(400, "'prompt' must be a string", "prompt");
    bool add_special = true;
    if (auto a = b.find("add_special_tokens"); a != b.end() && !a->is_null()) {
      if (!a->is_boolean()) throw ApiError(400, "'add_special_tokens' must be a boolean", "add_special_tokens");
      add_special = a->get<bool>();
    }
    ids = tokenizer_.encode(it->get<std::string>(), add_special);
  }
  return json_response(200, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", max_model_len_}});
}

HttpResponse ApiServer::detokenize(const HttpRequest& request) {
  const json b = parse_json_object(request.body);
  auto it = b.find("tokens");
  if (it == b.end() || !it->is_array()) throw ApiError(400, "'tokens' must be an array of token ids", "tokens");
  std::vector<int32_t> ids;
  for (const json& v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= tokenizer_.vocab_size())
      throw ApiError(400, "'tokens' must hold ids of this model's vocabulary", "tokens");
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return json_response(200, {{"prompt", tokenizer_.decode(ids, false)}});
}

std::string ApiServer::metrics_text() const {
  MetricsInput in;
  in.engine = engine_.metrics();
  in.model_name = options_.served_model_name;
  in.in_flight = shared_->in_flight.load();
  in.open_connections = connections_ ? static_cast<int64_t>(connections_()) : 0;
  in.client_disconnects = shared_->client_disconnects.load();
  in.startup_phases = startup_phases_;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    in.http_requests = shared_->http_requests;
  }
  return render_metrics(in);
}

}  // namespace basalt

// The workflow runs in the gateway: see service.h.
#include "workflow/service.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "server/http_client.h"
#include "server/prometheus_text.h"
#include "server/sse.h"
#include "workflow/template.h"

namespace basalt::workflow {
namespace {

namespace asio = boost::asio;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxMapItems = 1024;
constexpr size_t kMaxBodyBytes = size_t{8} << 20;
constexpr size_t kMaxRunsKept = 10000;
constexpr size_t kMaxUnsentTokenBytes = size_t{1} << 20;
constexpr double kStepBounds[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                  2.5,  5,     10,   30,  60,   120, 300};
constexpr size_t kStepBuckets = std::size(kStepBounds);

HttpResponse json_answer(int status, json body) {
  HttpResponse r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

HttpResponse error_answer(int status, const std::string& message) {
  const char* type = status == 404   ? "not_found_error"
                     : status == 409 ? "conflict_error"
                                     : "invalid_request_error";
  return json_answer(status,
                     {{"error", {{"message", message}, {"type", type}, {"code", nullptr}}}});
}

bool valid_run_id(std::string_view id) {
  return !id.empty() && id.size() <= 64 && std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

std::string new_run_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("run-{:016x}", rng());
}

// FNV-1a: a seed that is the same for a step in every attempt and after a
// restart (std::hash promises neither).
int64_t stable_seed(std::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h & 0x7fffffff);
}

// The origin ("http://host:port") and the path (with its query) of a URL
// the loader accepted.
std::pair<std::string, std::string> split_url(const std::string& url) {
  const size_t authority = url.find("://") + 3;
  const size_t path = url.find_first_of("/?", authority);
  if (path == std::string::npos) return {url, "/"};
  std::string rest = url.substr(path);
  if (rest[0] == '?') rest = "/" + rest;
  return {url.substr(0, path), rest};
}

struct CallResult {
  bool ok = false;
  json output;
  std::string error;
  bool timed_out = false;
  // The request's own fault (a 4xx other than 408 and 429): the same
  // request would fail again, so only the fallback model is tried.
  bool final = false;
};

// One attempt of a model or HTTP step: started once, ended once (its
// result, a timeout, or cancel()), on a strand of its own.
class Call : public std::enable_shared_from_this<Call> {
 public:
  explicit Call(asio::io_context& io) : strand_(asio::make_strand(io)), timer_(strand_) {}
  virtual ~Call() = default;

  void start(std::chrono::milliseconds timeout, std::function<void(CallResult)> done) {
    done_ = std::move(done);
    asio::post(strand_, [self = shared_from_this(), timeout] {
      if (self->finished_) return;
      self->timer_.expires_after(timeout);
      self->timer_.async_wait(
          [weak = self->weak_from_this(), timeout](const boost::system::error_code& ec) {
            if (ec) return;
            if (auto s = weak.lock())
              s->end_early(
                  fmt::format("timed out after {} s", static_cast<double>(timeout.count()) / 1000),
                  true);
          });
      self->begin();
    });
  }
  // Ends the attempt (its request aborted); its done is told "cancelled".
  void cancel() {
    asio::post(strand_, [self = shared_from_this()] { self->end_early("cancelled", false); });
  }

 protected:
  virtual void begin() = 0;  // on the strand
  virtual void stop() = 0;   // aborts what is in flight; on the strand
  void finish(CallResult result) {
    if (finished_) return;
    finished_ = true;
    timer_.cancel();
    std::function<void(CallResult)> done = std::move(done_);
    done_ = nullptr;
    if (done) done(std::move(result));
  }
  void fail(std::string error) {
    CallResult r;
    r.error = std::move(error);
    finish(std::move(r));
  }
  void end_early(std::string why, bool timed_out) {
    if (finished_) return;
    stop();
    CallResult r;
    r.error = std::move(why);
    r.timed_out = timed_out;
    finish(std::move(r));
  }

  asio::strand<asio::io_context::executor_type> strand_;
  asio::steady_timer timer_;
  bool finished_ = false;

 private:
  std::function<void(CallResult)> done_;
};

// A model step's attempt: a streamed completion or chat given to the
// gateway's own handler, read event by event.
class ModelAttempt : public Call {
 public:
  ModelAttempt(asio::io_context& io, WorkflowService::Dispatch dispatch, HttpRequest request,
               bool chat, bool wants_json, std::function<void(const std::string&)> on_token)
      : Call(io),
        dispatch_(std::move(dispatch)),
        request_(std::move(request)),
        chat_(chat),
        wants_json_(wants_json),
        on_token_(std::move(on_token)),
        parser_([this](std::string_view data) { on_event(data); }) {}

 private:
  void begin() override {
    HandlerResult r;
    try {
      r = dispatch_(request_);
    } catch (const std::exception& e) {
      fail(std::string("the gateway refused the request: ") + e.what());
      return;
    }
    if (!r.producer) {
      status_ = r.response.status;
      error_body_ = r.response.body;
      end();
      return;
    }
    producer_ = std::move(r.producer);
    producer_->start([weak = weak_from_this()] {
      if (auto self = weak.lock())
        asio::post(static_cast<ModelAttempt*>(self.get())->strand_,
                   [self] { static_cast<ModelAttempt*>(self.get())->drain(); });
    });
    drain();
  }

  void stop() override {
    if (producer_ && !producer_done_) {
      producer_done_ = true;
      producer_->abort();
    }
  }

  void drain() {
    while (!finished_ && producer_ && !producer_done_) {
      ResponseProducer::Output out;
      producer_->pull(out);
      std::string bytes;
      if (out.head) {
        status_ = out.head->status;
        bytes = std::move(out.head->body);
      }
      bytes += out.data;
      if (status_ == 200) {
        if (!parser_.feed(bytes)) {
          stop();
          fail("the answer's stream did not parse: " + parser_.error());
          return;
        }
      } else if (error_body_.size() < 65536) {
        error_body_ += bytes;
      }
      if (out.done) {
        producer_done_ = true;
        end();
        return;
      }
      if (!out.head && out.data.empty()) return;
    }
  }

  void on_event(std::string_view data) {
    if (data == "[DONE]") {
      saw_done_ = true;
      return;
    }
    json event;
    try {
      event = json::parse(data);
    } catch (const json::exception&) {
      stream_error_ = "an event of the answer is not JSON";
      return;
    }
    if (const auto e = event.find("error"); e != event.end()) {
      stream_error_ = e->is_object() && e->contains("message") && (*e)["message"].is_string()
                          ? (*e)["message"].get<std::string>()
                          : e->dump();
      return;
    }
    const auto choices = event.find("choices");
    if (choices == event.end() || !choices->is_array() || choices->empty() ||
        !(*choices)[0].is_object())
      return;
    const json& choice = (*choices)[0];
    std::string piece;
    if (chat_) {
      const auto delta = choice.find("delta");
      if (delta == choice.end() || !delta->is_object()) return;
      if (const auto c = delta->find("content"); c != delta->end() && c->is_string())
        piece = c->get<std::string>();
      if (const auto calls = delta->find("tool_calls"); calls != delta->end() && calls->is_array())
        merge_tool_calls(*calls);
    } else if (const auto t = choice.find("text"); t != choice.end() && t->is_string()) {
      piece = t->get<std::string>();
    }
    if (!piece.empty()) {
      text_ += piece;
      on_token_(piece);
    }
  }

  // Streamed tool calls come in pieces by index: the id, type and name
  // once, the arguments' text spread over several events.
  void merge_tool_calls(const json& calls) {
    for (const json& call : calls) {
      if (!call.is_object()) continue;
      const auto index = call.find("index");
      const size_t i =
          index != call.end() && index->is_number_unsigned() ? index->get<size_t>() : 0;
      if (i >= 128) continue;
      while (tool_calls_.size() <= i)
        tool_calls_.push_back(
            {{"type", "function"}, {"function", {{"name", ""}, {"arguments", ""}}}});
      json& into = tool_calls_[i];
      if (const auto id = call.find("id"); id != call.end() && id->is_string()) into["id"] = *id;
      const auto fn = call.find("function");
      if (fn == call.end() || !fn->is_object()) continue;
      if (const auto n = fn->find("name"); n != fn->end() && n->is_string())
        into["function"]["name"] =
            into["function"]["name"].get<std::string>() + n->get<std::string>();
      if (const auto a = fn->find("arguments"); a != fn->end() && a->is_string())
        into["function"]["arguments"] =
            into["function"]["arguments"].get<std::string>() + a->get<std::string>();
    }
  }

  void end() {
    if (status_ != 200) {
      std::string message = error_body_.substr(0, 512);
      try {
        const json body = json::parse(error_body_);
        if (body.contains("error") && body["error"].is_object() &&
            body["error"].contains("message"))
          message = body["error"]["message"].dump();
      } catch (const json::exception&) {
      }
      CallResult r;
      r.error = fmt::format("HTTP {}: {}", status_, message);
      r.final = status_ >= 400 && status_ < 500 && status_ != 408 && status_ != 429;
      finish(std::move(r));
      return;
    }
    parser_.finish();
    if (!stream_error_.empty()) return fail("the stream ended with an error: " + stream_error_);
    if (!saw_done_) return fail("the stream ended before data: [DONE]");
    CallResult r;
    r.ok = true;
    if (!tool_calls_.empty()) {
      r.output = {{"content", text_}, {"tool_calls", tool_calls_}};
    } else if (wants_json_) {
      try {
        r.output = json::parse(text_);
      } catch (const json::exception&) {
        return fail("the answer is not the JSON its response_format asked for: " +
                    text_.substr(0, 200));
      }
    } else {
      r.output = text_;
    }
    finish(std::move(r));
  }

  WorkflowService::Dispatch dispatch_;
  HttpRequest request_;
  bool chat_;
  bool wants_json_;
  std::function<void(const std::string&)> on_token_;
  SseParser parser_;
  std::unique_ptr<ResponseProducer> producer_;
  bool producer_done_ = false;
  int status_ = 0;
  std::string error_body_;
  std::string text_;
  json tool_calls_ = json::array();
  bool saw_done_ = false;
  std::string stream_error_;
};

// An HTTP step's attempt: one exchange with the user's service.
class HttpAttempt : public Call {
 public:
  HttpAttempt(asio::io_context& io, HttpClient& client, OutgoingRequest request)
      : Call(io), client_(client), request_(std::move(request)) {}

 private:
  void begin() override {
    auto self = std::static_pointer_cast<HttpAttempt>(shared_from_this());
    ExchangeCallbacks callbacks;
    // The client's callbacks run on its strand, one after another; the
    // result is read on ours only after on_done, which comes last.
    callbacks.on_head = [self](const IncomingHead& head) {
      self->status_ = head.status;
      self->json_body_ =
          head.header("content-type").value_or("").find("json") != std::string_view::npos;
    };
    callbacks.on_data = [self](std::string_view bytes) {
      if (self->body_.size() + bytes.size() <= kMaxBodyBytes)
        self->body_.append(bytes);
      else
        self->too_big_ = true;
    };
    callbacks.on_done = [self](HttpFailure failure, const std::string& message) {
      asio::post(self->strand_, [self, failure, message] { self->end(failure, message); });
    };
    exchange_ = client_.send(request_, std::move(callbacks));
  }
  void stop() override { exchange_.cancel(); }

  void end(HttpFailure failure, const std::string& message) {
    if (finished_) return;
    if (failure != HttpFailure::kNone)
      return fail(fmt::format("{} {}: {}", request_.method, client_.url().host,
                              message.empty() ? http_failure_name(failure) : message));
    if (too_big_) return fail(fmt::format("the answer is over {} bytes", kMaxBodyBytes));
    if (status_ < 200 || status_ > 299)
      return fail(fmt::format("HTTP {}: {}", status_, body_.substr(0, 512)));
    CallResult r;
    r.ok = true;
    r.output = body_;
    if (json_body_) {
      if (json_nesting_depth(body_) > 64)
        return fail("the answer's JSON is nested more than 64 levels");
      try {
        r.output = json::parse(body_);
      } catch (const json::exception&) {
        return fail("the answer says it is JSON but does not parse");
      }
    }
    finish(std::move(r));
  }

  HttpClient& client_;
  OutgoingRequest request_;
  ExchangeHandle exchange_;
  int status_ = 0;
  bool json_body_ = false;
  bool too_big_ = false;
  std::string body_;
};

struct StepState {
  std::string status = "pending";  // pending, running, completed, skipped, failed, cancelled
  int attempts = 0;
  Clock::time_point started{};
  double start_s = -1;  // from the run's (latest) start
  double seconds = 0;
  json output;
  std::string error;
  bool replayed = false;
  // A map's items: those with a result, how many there are, which run now.
  std::map<size_t, json> items;
  size_t item_count = 0;
  size_t next_item = 0;
  size_t items_running = 0;
  bool done() const { return status == "completed" || status == "skipped"; }
};

struct Run {
  std::mutex mu;
  std::string id;
  std::shared_ptr<const Workflow> wf;
  json input;
  std::string status = "running";  // running, completed, failed, cancelled, interrupted
  std::vector<StepState> steps;
  json output;
  std::string error;
  std::string failed_step;
  Clock::time_point started = Clock::now();
  double seconds = 0;
  // Bumped when the run starts again: callbacks of an earlier start are ignored.
  uint64_t generation = 0;
  // The attached client: its events not yet pulled, and how to wake it.
  std::string events;
  std::function<void()> wake;
  bool attached = false;
  std::set<std::shared_ptr<Call>> in_flight;
  int log_fd = -1;
  HttpRequest origin;       // the headers the steps carry (Authorization, region)
  std::weak_ptr<Run> self;  // for callbacks, which must not keep a forgotten run alive

  ~Run() {
    if (log_fd >= 0) ::close(log_fd);
  }
  bool terminal() const { return status != "running"; }
};

// What a change to a run makes happen once its lock is released.
struct Effects {
  std::vector<std::function<void()>> actions;
  std::function<void()> wake;
  void run() {
    for (auto& a : actions) a();
    if (wake) wake();
  }
};

struct StepHistogram {
  std::array<uint64_t, kStepBuckets> buckets{};
  uint64_t count = 0;
  double sum = 0;
};

}  // namespace

struct WorkflowService::Impl : std::enable_shared_from_this<WorkflowService::Impl> {
  // The definitions and the HTTP steps' clients, replaced on reload.
  mutable std::mutex defs_mu;
  std::map<std::string, std::shared_ptr<const Workflow>> workflows;
  Dispatch dispatch;
  asio::io_context& io;
  ServiceOptions options;
  std::map<std::string, std::unique_ptr<HttpClient>> clients;  // by origin
  size_t replayed = 0;

  std::mutex runs_mu;
  std::map<std::string, std::shared_ptr<Run>> runs;
  std::vector<std::string> run_order;  // oldest first, for the cap on runs kept

  mutable std::mutex metrics_mu;
  std::map<std::pair<std::string, std::string>, uint64_t> runs_total;  // workflow, status
  int64_t runs_in_progress = 0;
  std::map<std::pair<std::string, std::string>, StepHistogram> step_seconds;
  std::map<std::tuple<std::string, std::string, std::string>, uint64_t> step_attempts;

  explicit Impl(asio::io_context& io_context) : io(io_context) {}

  // ---- records ----

  // Appends one record to the run's log; false when it could not be written.
  static bool record(Run& run, const json& line) {
    if (run.log_fd < 0) return true;
    const std::string text = line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    size_t written = 0;
    while (written < text.size()) {
      const ssize_t n = ::write(run.log_fd, text.data() + written, text.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      written += static_cast<size_t>(n);
    }
    return true;
  }

  std::string log_path(const std::string& id) const {
    return options.state_dir + "/" + id + ".jsonl";
  }

  void open_log(Run& run) {
    if (options.state_dir.empty() || run.log_fd >= 0) return;
    run.log_fd = ::open(log_path(run.id).c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    BASALT_CHECK(run.log_fd >= 0, "{}: cannot be opened: {}", log_path(run.id),
                 std::strerror(errno));
  }

  void replay_state_dir() {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(options.state_dir, ec);
    BASALT_CHECK(!ec && fs::is_directory(options.state_dir), "--workflow-state-dir {}: {}",
                 options.state_dir, ec ? ec.message() : "not a directory");
    std::vector<fs::path> files;
    for (const fs::directory_entry& e : fs::directory_iterator(options.state_dir, ec))
      if (e.is_regular_file() && e.path().extension() == ".jsonl") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
      try {
        replay_file(file);
      } catch (const std::exception& e) {
        LogLine("workflow_state", LogLevel::kWarning)
            .add("file", file.string())
            .add("skipped", e.what())
            .emit();
      }
    }
  }

  void replay_file(const std::filesystem::path& file) {
    std::ifstream in(file, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // A last line without its newline was cut by a crash: dropped, and cut
    // from the file so that the next record starts a line of its own.
    const size_t complete = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
    if (complete < text.size()) {
      std::filesystem::resize_file(file, complete);
      text.resize(complete);
    }
    auto run = std::make_shared<Run>();
    run->self = run;
    run->id = file.stem().string();
    BASALT_CHECK(valid_run_id(run->id), "not a run's file name");
    size_t line_no = 0;
    size_t begin = 0;
    while (begin < text.size()) {
      const size_t end = text.find('\n', begin);
      const std::string_view line(text.data() + begin, end - begin);
      begin = end + 1;
      ++line_no;
      BASALT_CHECK(json_nesting_depth(line) <= 64, "line {}: nested too deep", line_no);
      json r;
      try {
        r = json::parse(line);
      } catch (const json::exception&) {
        fail("line {}: not JSON", line_no);
      }
      BASALT_CHECK(r.is_object() && r.contains("kind") && r["kind"].is_string(), "line {}: no kind",
                   line_no);
      const std::string kind = r["kind"];
      if (line_no == 1) {
        BASALT_CHECK(kind == "run" && r.contains("workflow") && r["workflow"].is_string(),
                     "line 1: not the run's record");
        const auto wf = workflows.find(r["workflow"].get<std::string>());
        BASALT_CHECK(wf != workflows.end(), "workflow '{}' is not loaded",
                     r["workflow"].get<std::string>());
        run->wf = wf->second;
        run->input = r.value("input", json::object());
        run->steps.assign(run->wf->steps.size(), StepState{});
        run->status = "interrupted";
        continue;
      }
      const auto step_index = [&]() -> size_t {
        const int64_t i = r.contains("step") && r["step"].is_string()
                              ? run->wf->find(r["step"].get<std::string>())
                              : -1;
        BASALT_CHECK(i >= 0, "line {}: no such step", line_no);
        return static_cast<size_t>(i);
      };
      if (kind == "item") {
        StepState& s = run->steps[step_index()];
        BASALT_CHECK(r.contains("index") && r["index"].is_number_unsigned() &&
                         r["index"].get<size_t>() < kMaxMapItems,
                     "line {}: no index", line_no);
        s.items[r["index"].get<size_t>()] = r.value("output", json());
      } else if (kind == "step") {
        StepState& s = run->steps[step_index()];
        s.status = r.value("skipped", false) ? "skipped" : "completed";
        s.output = r.value("output", json());
        s.attempts = r.value("attempts", 0);
        s.seconds = r.value("seconds", 0.0);
        s.replayed = true;
      } else if (kind == "end") {
        run->status = r.value("status", std::string("failed"));
        run->output = r.value("output", json());
        run->error = r.value("error", std::string());
        run->failed_step = r.value("step", std::string());
        run->seconds = r.value("seconds", 0.0);
      } else {
        fail("line {}: unknown kind '{}'", line_no, kind);
      }
    }
    BASALT_CHECK(run->wf != nullptr, "empty");
    runs[run->id] = run;
    run_order.push_back(run->id);
    ++replayed;
  }

  // ---- events ----

  static void emit(Run& run, std::string_view name, json data, Effects& fx) {
    if (!run.attached) return;
    // A client that reads slower than the steps write: its token events
    // wait here, so past a bound they are left out (each step's result
    // still carries the whole text); the other events are few.
    if (name == "token" && run.events.size() > kMaxUnsentTokenBytes) return;
    run.events += fmt::format("event: {}\ndata: {}\n\n", name,
                              data.dump(-1, ' ', false, json::error_handler_t::replace));
    fx.wake = run.wake;
  }

  // A finished step again, for a client that attaches after it finished
  // (a resumed or a completed run).
  static void emit_recorded_step(Run& run, const Workflow& wf, size_t index, const StepState& s, Effects& fx) {
    if (s.status == "skipped") {
      emit(run, "step_skipped", {{"step", wf.steps[index].name}}, fx);
      return;
    }
    emit(run, "step_result",
         {{"step", wf.steps[index].name},
          {"output", s.output},
          {"seconds", s.seconds},
          {"attempts", s.attempts},
          {"replayed", true}},
         fx);
  }

  // ---- the state a step's templates see ----

  static json scope_of(const Run& run, const Step& step) {
    json scope = {{"input", run.input}, {"steps", json::object()}};
    for (size_t d : step.depends_on)
      scope["steps"][run.wf->steps[d].name] = {{"output", run.steps[d].output}};
    return scope;
  }

  // ---- running ----

  void note_attempt(const Run& run, const Step& step, const char* outcome) {
    std::lock_guard<std::mutex> lock(metrics_mu);
    ++step_attempts[{run.wf->name, step.name, outcome}];
  }

  void note_step(Run& run, size_t index) {
    const Step& step = run.wf->steps[index];
    StepState& s = run.steps[index];
    if (!s.replayed && s.status == "completed") {
      std::lock_guard<std::mutex> lock(metrics_mu);
      StepHistogram& h = step_seconds[{run.wf->name, step.name}];
      for (size_t b = 0; b < kStepBuckets; ++b)
        if (s.seconds <= kStepBounds[b]) {
          ++h.buckets[b];
          break;
        }
      ++h.count;
      h.sum += s.seconds;
    }
    if (options.log_steps)
      LogLine("workflow_step", s.status == "failed" ? LogLevel::kWarning : LogLevel::kInfo)
          .add("run", run.id)
          .add("workflow", run.wf->name)
          .add("step", step.name)
          .add("type", step_type_name(step.type))
          .add("status", s.status)
          .add("attempts", s.attempts)
          .add("seconds", s.seconds)
          .add("replayed", s.replayed)
          .emit();
  }

  // The step ends with `output`: recorded, announced, and the run moves on.
  void complete_step(Run& run, size_t index, json output, Effects& fx) {
    StepState& s = run.steps[index];
    s.status = "completed";
    s.output = std::move(output);
    s.seconds = std::chrono::duration<double>(Clock::now() - s.started).count();
    if (!record(run, {{"kind", "step"},
                      {"step", run.wf->steps[index].name},
                      {"output", s.output},
                      {"attempts", s.attempts},
                      {"seconds", s.seconds}}))
      return fail_run(run, run.wf->steps[index].name, "the run's record could not be written", fx);
    emit(run, "step_result",
         {{"step", run.wf->steps[index].name},
          {"output", s.output},
          {"seconds", s.seconds},
          {"attempts", s.attempts},
          {"replayed", false}},
         fx);
    note_step(run, index);
    advance(run, fx);
  }

  void skip_step(Run& run, size_t index, Effects& fx) {
    StepState& s = run.steps[index];
    s.status = "skipped";
    s.output = nullptr;
    if (!record(run, {{"kind", "step"}, {"step", run.wf->steps[index].name}, {"skipped", true}}))
      return fail_run(run, run.wf->steps[index].name, "the run's record could not be written", fx);
    emit(run, "step_skipped", {{"step", run.wf->steps[index].name}}, fx);
    note_step(run, index);
  }

  void end_run(Run& run, const std::string& status, Effects& fx) {
    run.status = status;
    run.seconds = std::chrono::duration<double>(Clock::now() - run.started).count();
    json end = {{"kind", "end"}, {"status", status}, {"seconds", run.seconds}};
    if (status == "completed")
      end["output"] = run.output;
    else {
      end["error"] = run.error;
      end["step"] = run.failed_step;
    }
    record(run, end);  // the end is advice: a run without it replays as interrupted
    for (const std::shared_ptr<Call>& call : run.in_flight)
      fx.actions.push_back([call] { call->cancel(); });
    run.in_flight.clear();
    for (StepState& s : run.steps)
      if (s.status == "running") s.status = status == "cancelled" ? "cancelled" : "failed";
    {
      std::lock_guard<std::mutex> lock(metrics_mu);
      ++runs_total[{run.wf->name, status}];
      --runs_in_progress;
    }
    if (options.log_steps)
      LogLine("workflow_run", status == "completed" ? LogLevel::kInfo : LogLevel::kWarning)
          .add("run", run.id)
          .add("workflow", run.wf->name)
          .add("status", status)
          .add("seconds", run.seconds)
          .add("error", run.error)
          .emit();
    fx.wake = run.wake;
  }

  void fail_run(Run& run, const std::string& step, const std::string& error, Effects& fx) {
    if (run.terminal()) return;
    run.error = error;
    run.failed_step = step;
    const int64_t index = run.wf->find(step);
    if (index >= 0) {
      run.steps[static_cast<size_t>(index)].status = "failed";
      run.steps[static_cast<size_t>(index)].error = error;
      note_step(run, static_cast<size_t>(index));
    }
    emit(run, "run_failed", {{"run_id", run.id}, {"step", step}, {"error", error}}, fx);
    end_run(run, "failed", fx);
  }

  // Starts what can start, skips what a condition ruled out, ends the run
  // when every step is done. Under the run's lock.
  void advance(Run& run, Effects& fx) {
    bool changed = true;
    while (changed && !run.terminal()) {
      changed = false;
      bool all_done = true;
      for (size_t index : run.wf->order) {
        if (run.terminal()) return;
        StepState& s = run.steps[index];
        if (s.done()) continue;
        all_done = false;
        if (s.status != "pending") continue;
        const Step& step = run.wf->steps[index];
        if (!std::all_of(step.depends_on.begin(), step.depends_on.end(),
                         [&](size_t d) { return run.steps[d].done(); }))
          continue;
        const bool ruled_out =
            std::any_of(step.gated_by.begin(), step.gated_by.end(), [&](const auto& gate) {
              const StepState& c = run.steps[gate.first];
              return c.status == "skipped" || c.output != json(gate.second);
            });
        changed = true;
        if (ruled_out) {
          skip_step(run, index, fx);
          continue;
        }
        start_step(run, index, fx);
      }
      if (all_done && !run.terminal()) {
        finish_run(run, fx);
        return;
      }
    }
  }

  void finish_run(Run& run, Effects& fx) {
    try {
      if (run.wf->has_output) {
        json scope = {{"input", run.input}, {"steps", json::object()}};
        for (size_t i = 0; i < run.steps.size(); ++i)
          scope["steps"][run.wf->steps[i].name] = {{"output", run.steps[i].output}};
        run.output = render_value(run.wf->output, scope);
      } else {
        run.output = run.steps[run.wf->order.back()].output;
      }
    } catch (const TemplateError& e) {
      return fail_run(run, "", std::string("output: ") + e.what(), fx);
    }
    run.seconds = std::chrono::duration<double>(Clock::now() - run.started).count();
    emit(run, "run_completed",
         {{"run_id", run.id}, {"output", run.output}, {"seconds", run.seconds}}, fx);
    end_run(run, "completed", fx);
  }

  void start_step(Run& run, size_t index, Effects& fx) {
    const Step& step = run.wf->steps[index];
    StepState& s = run.steps[index];
    s.status = "running";
    s.started = Clock::now();
    s.start_s = std::chrono::duration<double>(s.started - run.started).count();
    s.attempts = 0;
    s.error.clear();
    const json scope = scope_of(run, step);
    switch (step.type) {
      case StepType::kCondition: {
        bool value = false;
        try {
          value = evaluate_condition(render_value(step.condition, scope));
        } catch (const TemplateError& e) {
          return fail_run(run, step.name, std::string("if: ") + e.what(), fx);
        }
        s.attempts = 1;
        emit(run, "step_started", {{"step", step.name}, {"attempt", 1}}, fx);
        return complete_step(run, index, value, fx);
      }
      case StepType::kModel:
      case StepType::kHttp:
        return start_attempt(run, index, step, std::nullopt, 1, scope, fx);
      case StepType::kMap: {
        json list;
        try {
          list = Template::parse(step.over).render(scope);
        } catch (const TemplateError& e) {
          return fail_run(run, step.name, std::string("over: ") + e.what(), fx);
        }
        if (!list.is_array() || list.size() > kMaxMapItems)
          return fail_run(
              run, step.name,
              fmt::format(
                  "over: must be a list of at most {} items, not {}", kMaxMapItems,
                  list.is_array() ? fmt::format("{} items", list.size()) : list.type_name()),
              fx);
        s.item_count = list.size();
        s.next_item = 0;
        s.items_running = 0;
        emit(run, "step_started", {{"step", step.name}, {"items", s.item_count}}, fx);
        // Items with a recorded result are not run again.
        for (const auto& [i, output] : s.items)
          emit(run, "step_result",
               {{"step", step.name}, {"item", i}, {"output", output}, {"replayed", true}}, fx);
        s.output = std::move(list);  // the items, until the step's output replaces them
        return pump_map(run, index, fx);
      }
    }
  }

  // Starts a map's next items, up to its concurrency; completes the step
  // once every item has a result.
  void pump_map(Run& run, size_t index, Effects& fx) {
    const Step& step = run.wf->steps[index];
    StepState& s = run.steps[index];
    while (s.items_running < static_cast<size_t>(step.concurrency) && s.next_item < s.item_count &&
           !run.terminal()) {
      const size_t i = s.next_item++;
      if (s.items.count(i)) continue;
      json scope = scope_of(run, step);
      scope["item"] = s.output[i];
      scope["index"] = i;
      ++s.items_running;
      start_attempt(run, index, *step.inner, i, 1, scope, fx);
    }
    if (!run.terminal() && s.items.size() == s.item_count && s.items_running == 0) {
      json out = json::array();
      for (const auto& [i, output] : s.items) out.push_back(output);
      complete_step(run, index, std::move(out), fx);
    }
  }

  // One attempt of a model or HTTP call (a step's, or a map item's with
  // `item`): its request rendered now, sent once the lock is released.
  void start_attempt(Run& run, size_t index, const Step& call, std::optional<size_t> item,
                     int attempt, json scope, Effects& fx) {
    const Step& step = run.wf->steps[index];
    const int per_model = call.retries + 1;
    const bool on_fallback = attempt > per_model;
    std::shared_ptr<Call> c;
    std::string model;
    try {
      if (call.type == StepType::kModel) {
        const ModelCall& m = call.model;
        model = on_fallback ? m.fallback_model : m.model;
        json body = m.params;
        body["model"] = model;
        body["stream"] = true;
        if (m.chat) {
          body["messages"] = json::array();
          for (const auto& [role, content] : m.messages)
            body["messages"].push_back(
                {{"role", role}, {"content", Template::parse(content).render(scope)}});
        } else {
          json prompt = Template::parse(m.prompt).render(scope);
          body["prompt"] = prompt.is_string() ? prompt : json(prompt.dump());
        }
        const std::string label = step.name + (item ? fmt::format("-{}", *item) : "");
        if (!body.contains("seed")) body["seed"] = stable_seed(run.id + "/" + label);
        HttpRequest request;
        request.method = "POST";
        request.path = request.target = m.chat ? "/v1/chat/completions" : "/v1/completions";
        request.remote = "workflow " + run.id;
        request.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
        for (const char* carried :
             {"authorization", "x-basalt-region", "traceparent", "tracestate"})
          if (const auto h = run.origin.header(carried))
            request.headers.emplace_back(carried, std::string(*h));
        request.headers.emplace_back("content-type", "application/json");
        if (!options.session_header.empty())
          request.headers.emplace_back(options.session_header, "wf-" + run.id);
        request.headers.emplace_back("x-request-id",
                                     fmt::format("wf-{}-{}-{}", run.id, label, attempt));
        std::weak_ptr<Run> weak_run = run.self;
        const uint64_t generation = run.generation;
        auto self = shared_from_this();
        auto on_token = [self, weak_run, generation, name = step.name,
                         item](const std::string& text) {
          auto r = weak_run.lock();
          if (!r) return;
          Effects fx2;
          {
            std::lock_guard<std::mutex> lock(r->mu);
            if (r->generation != generation || r->terminal()) return;
            json e = {{"step", name}, {"text", text}};
            if (item) e["item"] = *item;
            emit(*r, "token", std::move(e), fx2);
          }
          fx2.run();
        };
        c = std::make_shared<ModelAttempt>(io, dispatch, std::move(request), m.chat, m.wants_json,
                                           on_token);
      } else {
        const HttpCall& h = call.http;
        const auto [origin, path] = split_url(h.url);
        HttpClient* client_ptr = nullptr;
        {
          std::lock_guard<std::mutex> defs_lock(defs_mu);
          client_ptr = clients.at(origin).get();
        }
        HttpClient& client = *client_ptr;
        OutgoingRequest request;
        request.method = h.method;
        request.path = path;
        for (const auto& [name, value] : h.headers) {
          json v = Template::parse(value).render(scope);
          std::string text = v.is_string() ? v.get<std::string>() : v.dump();
          if (text.find_first_of("\r\n") != std::string::npos)
            throw TemplateError(fmt::format("headers.{}: the value has a line break", name));
          request.headers.emplace_back(name, std::move(text));
        }
        request.headers.emplace_back("X-Workflow-Run", run.id);
        if (!h.body.is_null()) {
          request.headers.emplace_back("Content-Type", "application/json");
          request.body =
              render_value(h.body, scope).dump(-1, ' ', false, json::error_handler_t::replace);
        }
        c = std::make_shared<HttpAttempt>(io, client, std::move(request));
      }
    } catch (const TemplateError& e) {
      // A value that is not there will not be there on a retry either.
      return fail_run(run, step.name, item ? fmt::format("item {}: {}", *item, e.what()) : e.what(),
                      fx);
    }
    run.steps[index].attempts += 1;
    json started = {{"step", step.name}, {"attempt", attempt}};
    if (!model.empty()) started["model"] = model;
    if (item) started["item"] = *item;
    emit(run, "step_started", std::move(started), fx);
    run.in_flight.insert(c);
    std::weak_ptr<Run> weak_run = run.self;
    const uint64_t generation = run.generation;
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(call.timeout_s * 1000));
    auto self = shared_from_this();
    // `call` lives in the workflow, which the run holds.
    const Step* call_ptr = &call;
    fx.actions.push_back([self, c, weak_run, generation, index, item, attempt, timeout, call_ptr,
                          scope = std::move(scope)]() mutable {
      c->start(timeout, [self, c, weak_run, generation, index, item, attempt, call_ptr,
                         scope = std::move(scope)](CallResult result) mutable {
        auto r = weak_run.lock();
        if (!r) return;
        Effects fx2;
        {
          std::lock_guard<std::mutex> lock(r->mu);
          r->in_flight.erase(c);
          if (r->generation != generation || r->terminal()) return;
          self->attempt_done(*r, index, *call_ptr, item, attempt, std::move(scope),
                             std::move(result), fx2);
        }
        fx2.run();
      });
    });
  }

  void attempt_done(Run& run, size_t index, const Step& call, std::optional<size_t> item,
                    int attempt, json scope, CallResult result, Effects& fx) {
    const Step& step = run.wf->steps[index];
    StepState& s = run.steps[index];
    note_attempt(run, step, result.ok ? "ok" : result.timed_out ? "timeout" : "failed");
    if (!result.ok) {
      const int per_model = call.retries + 1;
      const int total = call.type == StepType::kModel && !call.model.fallback_model.empty()
                            ? 2 * per_model
                            : per_model;
      if (result.final && attempt <= per_model && total > per_model) {
        json retry = {{"step", step.name}, {"attempt", attempt}, {"error", result.error}};
        if (item) retry["item"] = *item;
        emit(run, "step_retry", std::move(retry), fx);
        return start_attempt(run, index, call, item, per_model + 1, std::move(scope), fx);
      }
      if (attempt < total && !result.final) {
        json retry = {{"step", step.name}, {"attempt", attempt}, {"error", result.error}};
        if (item) retry["item"] = *item;
        emit(run, "step_retry", std::move(retry), fx);
        return start_attempt(run, index, call, item, attempt + 1, std::move(scope), fx);
      }
      return fail_run(run, step.name,
                      item ? fmt::format("item {}: {}", *item, result.error) : result.error, fx);
    }
    if (!item) return complete_step(run, index, std::move(result.output), fx);
    if (!record(
            run,
            {{"kind", "item"}, {"step", step.name}, {"index", *item}, {"output", result.output}}))
      return fail_run(run, step.name, "the run's record could not be written", fx);
    emit(run, "step_result",
         {{"step", step.name}, {"item", *item}, {"output", result.output}, {"replayed", false}},
         fx);
    s.items[*item] = std::move(result.output);
    --s.items_running;
    pump_map(run, index, fx);
  }

  // ---- the API ----

  json state_of(const Run& run) const {
    json steps = json::array();
    for (size_t i = 0; i < run.steps.size(); ++i) {
      const StepState& s = run.steps[i];
      const Step& step = run.wf->steps[i];
      json j = {{"name", step.name},
                {"type", step_type_name(step.type)},
                {"status", s.status},
                {"attempts", s.attempts},
                {"replayed", s.replayed}};
      if (s.start_s >= 0) j["start_s"] = s.start_s;
      if (s.done() || s.status == "failed")
        j["seconds"] = s.seconds;
      else if (s.status == "running")
        j["seconds"] = std::chrono::duration<double>(Clock::now() - s.started).count();
      if (s.done()) j["output"] = s.output;
      if (step.type == StepType::kMap) {
        j["items"] = s.item_count;
        j["items_done"] = s.items.size();
      }
      if (!s.error.empty()) j["error"] = s.error;
      steps.push_back(std::move(j));
    }
    json out = {{"run_id", run.id},
                {"workflow", run.wf->name},
                {"status", run.status},
                {"input", run.input},
                {"steps", std::move(steps)}};
    out["seconds"] = run.terminal()
                         ? run.seconds
                         : std::chrono::duration<double>(Clock::now() - run.started).count();
    if (run.status == "completed") out["output"] = run.output;
    if (!run.error.empty()) {
      out["error"] = run.error;
      out["failed_step"] = run.failed_step;
    }
    return out;
  }

  HandlerResult start_run(HttpRequest& request, const std::shared_ptr<const Workflow>& wf);
};

namespace {

// The answer to POST .../runs: the run's events as they happen (or, without
// stream, its state once it ends). Its abort() cancels the run.
class RunProducer : public ResponseProducer {
 public:
  RunProducer(std::shared_ptr<WorkflowService::Impl> impl, std::shared_ptr<Run> run, bool stream)
      : impl_(std::move(impl)), run_(std::move(run)), stream_(stream) {}

  void start(std::function<void()> wake) override {
    Effects fx;
    {
      std::lock_guard<std::mutex> lock(run_->mu);
      run_->wake = wake;
      if (!run_->terminal()) impl_->advance(*run_, fx);
    }
    fx.run();
    wake();
  }

  void pull(Output& out) override {
    std::lock_guard<std::mutex> lock(run_->mu);
    if (done_) return;
    if (stream_) {
      if (!head_sent_) {
        HttpResponse head;
        head.content_type = "text/event-stream";
        head.headers.emplace_back("Cache-Control", "no-cache");
        head.headers.emplace_back("X-Workflow-Run-Id", run_->id);
        out.head = std::move(head);
        head_sent_ = true;
      }
      out.data = std::move(run_->events);
      run_->events.clear();
    } else {
      // Without stream the events are not sent: none waits for the end.
      run_->events.clear();
      if (run_->terminal()) out.head = json_answer(200, impl_->state_of(*run_));
    }
    if (run_->terminal()) {
      out.done = true;
      done_ = true;
      detach();
    }
  }

  void abort() override {
    Effects fx;
    {
      std::lock_guard<std::mutex> lock(run_->mu);
      if (done_) return;
      done_ = true;
      detach();
      if (!run_->terminal()) {
        run_->error = "the client went away";
        impl_->end_run(*run_, "cancelled", fx);
        fx.wake = nullptr;
      }
    }
    fx.run();
  }

 private:
  void detach() {
    run_->attached = false;
    run_->wake = nullptr;
    run_->events.clear();
  }

  std::shared_ptr<WorkflowService::Impl> impl_;
  std::shared_ptr<Run> run_;
  bool stream_;
  bool head_sent_ = false;
  bool done_ = false;
};

}  // namespace

HandlerResult WorkflowService::Impl::start_run(HttpRequest& request,
                                               const std::shared_ptr<const Workflow>& wf) {
  if (json_nesting_depth(request.body) > 32)
    return {error_answer(400, "the body is nested more than 32 levels"), {}};
  json body;
  try {
    body = request.body.empty() ? json::object() : json::parse(request.body);
  } catch (const json::exception&) {
    return {error_answer(400, "the body is not JSON"), {}};
  }
  if (!body.is_object())
    return {error_answer(400, "the body must be a JSON object {input, run_id, stream}"), {}};
  for (const auto& [key, value] : body.items())
    if (key != "input" && key != "run_id" && key != "stream")
      return {error_answer(400, key + ": unknown field (input, run_id or stream)"), {}};
  const json input = body.value("input", json::object());
  if (const std::string problem = check_input(*wf, input); !problem.empty())
    return {error_answer(400, problem), {}};
  bool stream = true;
  if (const auto s = body.find("stream"); s != body.end()) {
    if (!s->is_boolean()) return {error_answer(400, "stream: must be true or false"), {}};
    stream = s->get<bool>();
  }
  std::string id;
  if (const auto r = body.find("run_id"); r != body.end()) {
    if (!r->is_string() || !valid_run_id(r->get<std::string>()))
      return {error_answer(400, "run_id: must be 1-64 of A-Z, a-z, 0-9, _ and -"), {}};
    id = r->get<std::string>();
  } else {
    id = new_run_id();
  }
  std::shared_ptr<Run> run;
  bool resumed = false;
  {
    std::lock_guard<std::mutex> lock(runs_mu);
    if (const auto it = runs.find(id); it != runs.end()) {
      run = it->second;
      resumed = true;
    } else {
      if (runs.size() >= kMaxRunsKept) {
        // The oldest finished run leaves memory (its record stays on disk).
        for (auto o = run_order.begin(); o != run_order.end(); ++o) {
          const auto old = runs.find(*o);
          if (old == runs.end()) continue;
          std::lock_guard<std::mutex> old_lock(old->second->mu);
          if (!old->second->terminal() || old->second->attached) continue;
          runs.erase(old);
          run_order.erase(o);
          break;
        }
      }
      run = std::make_shared<Run>();
      run->self = run;
      run->id = id;
      run->wf = wf;
      run->input = input;
      run->steps.assign(wf->steps.size(), StepState{});
      runs[id] = run;
      run_order.push_back(id);
    }
  }
  Effects fx;
  std::lock_guard<std::mutex> lock(run->mu);
  if (resumed) {
    if (run->wf->name != wf->name)
      return {error_answer(409, fmt::format("run {} is a run of workflow '{}'", id, run->wf->name)),
              {}};
    if (run->status == "running")
      return {error_answer(409, fmt::format("run {} is running (its client is attached)", id)), {}};
    if (run->input != input)
      return {error_answer(409, fmt::format("run {} was started with another input", id)), {}};
  }
  if (resumed && run->status == "completed") {
    // Its recorded results again, nothing run: from a copy of the record,
    // so that clients reading it at once do not share an event buffer
    // (nor touch the run's headers).
    auto replay = std::make_shared<Run>();
    replay->self = replay;
    replay->id = id;
    replay->wf = run->wf;
    replay->input = run->input;
    replay->status = run->status;
    replay->steps = run->steps;
    replay->output = run->output;
    replay->seconds = run->seconds;
    replay->attached = true;
    emit(*replay, "run", {{"run_id", id}, {"workflow", wf->name}, {"resumed", true}}, fx);
    for (size_t i : wf->order) emit_recorded_step(*replay, *wf, i, replay->steps[i], fx);
    emit(*replay, "run_completed",
         {{"run_id", id}, {"output", replay->output}, {"seconds", replay->seconds}}, fx);
    return {{}, std::make_unique<RunProducer>(shared_from_this(), replay, stream)};
  }
  run->origin.headers.clear();
  for (const char* carried : {"authorization", "x-basalt-region", "traceparent", "tracestate"})
    if (const auto h = request.header(carried))
      run->origin.headers.emplace_back(carried, std::string(*h));
  run->attached = true;
  run->events.clear();
  emit(*run, "run", {{"run_id", id}, {"workflow", wf->name}, {"resumed", resumed}}, fx);
  try {
    open_log(*run);
  } catch (const Error& e) {
    run->attached = false;
    return {error_answer(500, e.what()), {}};
  }
  if (!resumed && !record(*run, {{"kind", "run"}, {"workflow", wf->name}, {"input", input}})) {
    run->attached = false;
    return {error_answer(500, "the run's record could not be written"), {}};
  }
  // (Re)start: steps with a result stay done; the others start over.
  ++run->generation;
  run->status = "running";
  run->error.clear();
  run->failed_step.clear();
  run->output = nullptr;
  run->started = Clock::now();
  for (size_t i : wf->order) {
    StepState& s = run->steps[i];
    if (s.done()) {
      s.replayed = true;
      emit_recorded_step(*run, *wf, i, s, fx);
    } else {
      s.status = "pending";
      s.start_s = -1;
      s.error.clear();
    }
  }
  {
    std::lock_guard<std::mutex> metrics_lock(metrics_mu);
    ++runs_in_progress;
  }
  return {{}, std::make_unique<RunProducer>(shared_from_this(), run, stream)};
}

WorkflowService::WorkflowService(std::map<std::string, std::shared_ptr<const Workflow>> workflows,
                                 Dispatch dispatch, asio::io_context& io, ServiceOptions options)
    : impl_(std::make_shared<Impl>(io)) {
  impl_->dispatch = std::move(dispatch);
  impl_->options = std::move(options);
  set_workflows(std::move(workflows));
  if (!impl_->options.state_dir.empty()) impl_->replay_state_dir();
}

WorkflowService::~WorkflowService() = default;

void WorkflowService::set_workflows(
    std::map<std::string, std::shared_ptr<const Workflow>> workflows) {
  // One client per origin an HTTP step calls, resolved now (here, not on
  // an I/O thread): a host that does not resolve stops the gateway at
  // start, or refuses a reload, rather than failing a run later. Clients
  // are kept across reloads: runs of the old definitions may still call them.
  std::map<std::string, std::unique_ptr<HttpClient>> added;
  for (const auto& [name, wf] : workflows) {
    for (const Step& step : wf->steps) {
      const Step* call = step.type == StepType::kMap ? step.inner.get() : &step;
      if (call == nullptr || call->type != StepType::kHttp) continue;
      const std::string origin = split_url(call->http.url).first;
      {
        std::lock_guard<std::mutex> lock(impl_->defs_mu);
        if (impl_->clients.count(origin)) continue;
      }
      if (added.count(origin)) continue;
      HttpClientOptions client_options;
      client_options.max_body_bytes = kMaxBodyBytes + 1;
      added[origin] = std::make_unique<HttpClient>(
          impl_->io,
          parse_base_url(origin, fmt::format("workflow {} step {} url", name, step.name)),
          client_options);
    }
  }
  std::lock_guard<std::mutex> lock(impl_->defs_mu);
  for (auto& [origin, client] : added) impl_->clients.emplace(origin, std::move(client));
  impl_->workflows = std::move(workflows);
}

size_t WorkflowService::replayed_runs() const { return impl_->replayed; }

HandlerResult WorkflowService::handle(HttpRequest& request) {
  // /v1/workflows, /v1/workflows/{name}/runs, /v1/workflows/{name}/runs/{id}
  std::vector<std::string> parts;
  {
    const std::string_view path =
        std::string_view(request.path).substr(std::string_view("/v1/workflows").size());
    size_t pos = 0;
    while (pos < path.size()) {
      if (path[pos] == '/') {
        ++pos;
        continue;
      }
      const size_t end = std::min(path.find('/', pos), path.size());
      parts.emplace_back(path.substr(pos, end - pos));
      pos = end;
    }
  }
  const bool get = request.method == "GET" || request.method == "HEAD";
  if (parts.empty()) {
    if (!get) return {error_answer(405, "use GET"), {}};
    json list = json::array();
    std::lock_guard<std::mutex> lock(impl_->defs_mu);
    for (const auto& [name, wf] : impl_->workflows) list.push_back(wf->source);
    return {json_answer(200, {{"object", "list"}, {"data", std::move(list)}}), {}};
  }
  std::shared_ptr<const Workflow> wf;
  {
    std::lock_guard<std::mutex> lock(impl_->defs_mu);
    const auto it = impl_->workflows.find(parts[0]);
    if (it != impl_->workflows.end()) wf = it->second;
  }
  if (!wf || parts.size() < 2 || parts[1] != "runs" || parts.size() > 3)
    return {error_answer(404, "no such workflow or endpoint: " + request.path), {}};
  if (parts.size() == 2) {
    if (request.method != "POST") return {error_answer(405, "use POST to start a run"), {}};
    return impl_->start_run(request, wf);
  }
  if (!get) return {error_answer(405, "use GET"), {}};
  std::shared_ptr<Run> run;
  {
    std::lock_guard<std::mutex> lock(impl_->runs_mu);
    const auto it = impl_->runs.find(parts[2]);
    if (it != impl_->runs.end()) run = it->second;
  }
  if (!run || run->wf->name != parts[0]) return {error_answer(404, "no such run: " + parts[2]), {}};
  std::lock_guard<std::mutex> lock(run->mu);
  return {json_answer(200, impl_->state_of(*run)), {}};
}

std::string WorkflowService::metrics_text() const {
  PrometheusText out;
  std::lock_guard<std::mutex> lock(impl_->metrics_mu);
  out.family("basalt_route_workflow_runs_total", "counter",
             "Workflow runs ended, by workflow and status");
  for (const auto& [key, n] : impl_->runs_total)
    out.sample("basalt_route_workflow_runs_total", static_cast<double>(n),
               {{"workflow", key.first}, {"status", key.second}});
  out.gauge("basalt_route_workflow_runs_in_progress", "Workflow runs running now",
            static_cast<double>(impl_->runs_in_progress));
  out.family("basalt_route_workflow_step_seconds", "histogram",
             "Seconds a workflow step took, from its start to its result (retries included)");
  for (const auto& [key, h] : impl_->step_seconds) {
    out.histogram_samples("basalt_route_workflow_step_seconds", kStepBounds, h.buckets, h.count,
                          h.sum, {{"workflow", key.first}, {"step", key.second}});
  }
  out.family("basalt_route_workflow_step_attempts_total", "counter",
             "Attempts of workflow steps (a map's items each count), by how they ended");
  for (const auto& [key, n] : impl_->step_attempts)
    out.sample("basalt_route_workflow_step_attempts_total", static_cast<double>(n),
               {{"workflow", std::get<0>(key)},
                {"step", std::get<1>(key)},
                {"outcome", std::get<2>(key)}});
  return out.take();
}

}  // namespace basalt::workflow

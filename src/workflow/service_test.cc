// WorkflowService with a scripted stand-in for the gateway's handler (and a
// real HTTP server for the HTTP step): what each step sends, retries,
// fallback, timeouts, the map's concurrency limit, conditions, response
// formats and tool calls, cancel on client exit, and the state directory
// replayed so that finished steps are not sent again.
#include "workflow/service.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"

namespace basalt::workflow {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

// A stream the stand-in answers with: `pieces` as chat deltas (or
// completion texts), then [DONE]; after `delay` when set; never when
// `endless`.
class ScriptedStream : public ResponseProducer {
 public:
  ScriptedStream(boost::asio::io_context& io, std::vector<std::string> pieces, bool chat,
                 std::chrono::milliseconds delay, bool endless,
                 std::shared_ptr<std::atomic<int>> running,
                 std::shared_ptr<std::atomic<int>> aborted)
      : timer_(io),
        pieces_(std::move(pieces)),
        chat_(chat),
        delay_(delay),
        endless_(endless),
        running_(std::move(running)),
        aborted_(std::move(aborted)) {}
  void start(std::function<void()> wake) override {
    if (delay_.count() == 0) {
      ready_ = true;
      wake();
      return;
    }
    timer_.expires_after(delay_);
    timer_.async_wait([this, wake](const boost::system::error_code& ec) {
      if (ec) return;
      ready_ = true;
      wake();
    });
  }
  void pull(Output& out) override {
    if (!head_sent_) {
      HttpResponse head;
      head.content_type = "text/event-stream";
      out.head = head;
      head_sent_ = true;
    }
    if (!ready_ || endless_ || done_) return;
    for (const std::string& p : pieces_) {
      const json event = chat_ ? json{{"choices", {{{"index", 0}, {"delta", {{"content", p}}}}}}}
                               : json{{"choices", {{{"index", 0}, {"text", p}}}}};
      out.data += "data: " + event.dump() + "\n\n";
    }
    out.data += "data: [DONE]\n\n";
    out.done = true;
    done_ = true;
    --*running_;
  }
  void abort() override {
    ++*aborted_;
    if (!done_) --*running_;
    done_ = true;
  }

 private:
  boost::asio::steady_timer timer_;
  std::vector<std::string> pieces_;
  bool chat_;
  std::chrono::milliseconds delay_;
  bool endless_;
  std::shared_ptr<std::atomic<int>> running_;
  std::shared_ptr<std::atomic<int>> aborted_;
  std::atomic<bool> ready_{false};
  bool head_sent_ = false;
  bool done_ = false;
};

// What the stand-in answers a request with.
struct Answer {
  int status = 200;  // not 200: a whole error answer
  std::vector<std::string> pieces;
  std::chrono::milliseconds delay{0};
  bool endless = false;
  std::string raw_events;  // when set, sent as they are (then [DONE])
};

class RawStream : public ResponseProducer {
 public:
  explicit RawStream(std::string events) : events_(std::move(events)) {}
  void start(std::function<void()> wake) override { wake(); }
  void pull(Output& out) override {
    HttpResponse head;
    head.content_type = "text/event-stream";
    out.head = head;
    out.data = events_ + "data: [DONE]\n\n";
    out.done = true;
  }
  void abort() override {}

 private:
  std::string events_;
};

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_.emplace(io_.get_executor());
    for (int i = 0; i < 2; ++i) threads_.emplace_back([this] { io_.run(); });
  }
  void TearDown() override {
    service_.reset();
    work_.reset();
    io_.stop();
    for (std::thread& t : threads_) t.join();
    if (!state_dir_.empty()) std::filesystem::remove_all(state_dir_);
  }

  // The stand-in: `answer(body)` says how to answer each request; every
  // request is kept.
  void make_service(std::string definition, std::function<Answer(const json& body)> answer,
                    std::string state_dir = "") {
    std::map<std::string, std::shared_ptr<const Workflow>> defs;
    auto wf = std::make_shared<const Workflow>(parse_workflow(definition, "test"));
    defs[wf->name] = wf;
    ServiceOptions options;
    options.state_dir = std::move(state_dir);
    options.log_steps = false;
    service_ = std::make_unique<WorkflowService>(
        std::move(defs),
        [this, answer](HttpRequest& request) {
          const json body = json::parse(request.body);
          {
            std::lock_guard<std::mutex> lock(mu_);
            requests_.push_back(request);
          }
          const Answer a = answer(body);
          HandlerResult r;
          if (a.status != 200) {
            r.response.status = a.status;
            r.response.body = json{{"error", {{"message", "scripted failure"}}}}.dump();
            return r;
          }
          if (!a.raw_events.empty()) {
            r.producer = std::make_unique<RawStream>(a.raw_events);
            return r;
          }
          ++*running_;
          max_running_ = std::max(max_running_.load(), running_->load());
          r.producer = std::make_unique<ScriptedStream>(io_, a.pieces,
                                                        request.path == "/v1/chat/completions",
                                                        a.delay, a.endless, running_, aborted_);
          return r;
        },
        io_, options);
  }

  struct Events {
    std::vector<std::pair<std::string, json>> list;
    std::vector<json> named(const std::string& name) const {
      std::vector<json> out;
      for (const auto& [n, d] : list)
        if (n == name) out.push_back(d);
      return out;
    }
  };

  // Posts a run and reads its answer until it ends (or `stop_after`
  // events, then the client goes away).
  // `read_when`, if set: the client reads nothing before it holds (a
  // client slow to read).
  Events post(const json& body, size_t stop_after = 0, int* status = nullptr,
              std::function<bool()> read_when = nullptr) {
    HttpRequest request;
    request.method = "POST";
    request.path = request.target = "/v1/workflows/w/runs";
    request.headers.emplace_back("authorization", "Bearer client-key");
    request.body = body.dump();
    HandlerResult r = service_->handle(request);
    Events events;
    if (!r.producer) {
      if (status != nullptr) *status = r.response.status;
      return events;
    }
    if (status != nullptr) *status = 200;
    struct Waker {
      std::mutex mu;
      std::condition_variable cv;
      bool woken = false;
    };
    auto waker = std::make_shared<Waker>();
    r.producer->start([waker] {
      std::lock_guard<std::mutex> lock(waker->mu);
      waker->woken = true;
      waker->cv.notify_all();
    });
    for (int i = 0; read_when && !read_when() && i < 2000; ++i) std::this_thread::sleep_for(5ms);
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::unique_lock<std::mutex> lock(waker->mu);
        waker->cv.wait_for(lock, 20ms, [&] { return waker->woken; });
        waker->woken = false;
      }
      ResponseProducer::Output out;
      r.producer->pull(out);
      text += out.data;
      size_t end;
      while ((end = text.find("\n\n")) != std::string::npos) {
        const std::string raw = text.substr(0, end);
        text.erase(0, end + 2);
        const size_t data = raw.find("data: ");
        events.list.emplace_back(raw.substr(7, raw.find('\n') - 7),
                                 json::parse(raw.substr(data + 6)));
      }
      if (out.done) return events;
      if (stop_after > 0 && events.list.size() >= stop_after) {
        r.producer->abort();
        return events;
      }
    }
    ADD_FAILURE() << "the run did not end in 10 s";
    r.producer->abort();
    return events;
  }

  json state(const std::string& id) {
    HttpRequest request;
    request.method = "GET";
    request.path = request.target = "/v1/workflows/w/runs/" + id;
    return json::parse(service_->handle(request).response.body);
  }

  std::vector<HttpRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::vector<std::thread> threads_;
  std::unique_ptr<WorkflowService> service_;
  std::mutex mu_;
  std::vector<HttpRequest> requests_;
  std::shared_ptr<std::atomic<int>> running_ = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::atomic<int>> aborted_ = std::make_shared<std::atomic<int>>(0);
  std::atomic<int> max_running_{0};
  std::string state_dir_;
};

const char* kTwoSteps = R"({"name": "w", "input": {"text": "string"}, "steps": [
  {"name": "first", "type": "model", "model": "a", "retries": 2,
   "messages": [{"role": "user", "content": "Say {{ input.text }}"}], "max_tokens": 8},
  {"name": "second", "type": "model", "model": "a", "prompt": "{{ steps.first.output }}!", "temperature": 0,
   "seed": 9}]})";

TEST_F(ServiceTest, StepsAreStreamedRequestsWithTheRunsSessionAndSeed) {
  make_service(kTwoSteps, [](const json& body) {
    Answer a;
    a.pieces = body.contains("messages") ? std::vector<std::string>{"hel", "lo"}
                                         : std::vector<std::string>{"ok"};
    return a;
  });
  const Events e = post({{"run_id", "r1"}, {"input", {{"text", "hi"}}}});
  ASSERT_EQ(e.named("run_completed").size(), 1u) << e.list.size();
  EXPECT_EQ(e.named("run_completed")[0]["output"], "ok");
  const auto tokens = e.named("token");
  ASSERT_EQ(tokens.size(), 3u);
  EXPECT_EQ(tokens[0], (json{{"step", "first"}, {"text", "hel"}}));
  const auto r = requests();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].path, "/v1/chat/completions");
  EXPECT_EQ(r[1].path, "/v1/completions");
  const json first = json::parse(r[0].body);
  EXPECT_EQ(first["messages"], json::parse(R"([{"role": "user", "content": "Say hi"}])"));
  EXPECT_EQ(first["stream"], true);
  EXPECT_EQ(first["max_tokens"], 8);
  EXPECT_TRUE(first["seed"].is_number_integer());  // derived from the run: a retry draws the same
  const json second = json::parse(r[1].body);
  EXPECT_EQ(second["prompt"], "hello!");
  EXPECT_EQ(second["seed"], 9);  // the definition's own
  EXPECT_EQ(r[0].header("x-session-id"), "wf-r1");
  EXPECT_EQ(r[1].header("x-session-id"), "wf-r1");
  EXPECT_EQ(r[0].header("authorization"), "Bearer client-key");
  EXPECT_EQ(r[0].header("x-request-id"), "wf-r1-first-1");
  const json s = state("r1");
  EXPECT_EQ(s["status"], "completed");
  EXPECT_EQ(s["steps"][0]["output"], "hello");
  EXPECT_GE(s["steps"][1]["start_s"].get<double>(), 0);
  const std::string metrics = service_->metrics_text();
  EXPECT_NE(metrics.find(R"(basalt_route_workflow_runs_total{workflow="w",status="completed"} 1)"),
            std::string::npos);
  EXPECT_NE(
      metrics.find(R"(basalt_route_workflow_step_seconds_count{workflow="w",step="first"} 1)"),
      std::string::npos);
}

TEST_F(ServiceTest, FailedAttemptsAreRetriedWithTheSameSeed) {
  std::atomic<int> calls{0};
  make_service(kTwoSteps, [&](const json&) {
    Answer a;
    if (++calls <= 2) a.status = 503;
    a.pieces = {"x"};
    return a;
  });
  const Events e = post({{"run_id", "r2"}, {"input", {{"text", "hi"}}}});
  ASSERT_EQ(e.named("run_completed").size(), 1u);
  EXPECT_EQ(e.named("step_retry").size(), 2u);
  EXPECT_EQ(e.named("step_retry")[0]["error"], "HTTP 503: \"scripted failure\"");
  const auto r = requests();
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(json::parse(r[0].body)["seed"], json::parse(r[2].body)["seed"]);
  EXPECT_EQ(r[2].header("x-request-id"), "wf-r2-first-3");
  EXPECT_EQ(state("r2")["steps"][0]["attempts"], 3);
  EXPECT_NE(
      service_->metrics_text().find(
          R"(basalt_route_workflow_step_attempts_total{workflow="w",step="first",outcome="failed"} 2)"),
      std::string::npos);
}

TEST_F(ServiceTest, ARequestsOwnFaultGoesStraightToTheFallbackModel) {
  make_service(
      R"({"name": "w", "steps": [{"name": "s", "type": "model", "model": "a", "fallback_model": "b",
                   "retries": 3, "prompt": "p"}]})",
      [](const json& body) {
        Answer a;
        if (body["model"] == "a") a.status = 404;
        a.pieces = {"from b"};
        return a;
      });
  const Events e = post({{"run_id", "r3"}});
  ASSERT_EQ(e.named("run_completed").size(), 1u);
  EXPECT_EQ(e.named("run_completed")[0]["output"], "from b");
  const auto r = requests();
  ASSERT_EQ(r.size(), 2u);  // one on a (a 404 is not retried), one on b
  EXPECT_EQ(json::parse(r[1].body)["model"], "b");
  EXPECT_EQ(e.named("step_started")[1]["model"], "b");
}

TEST_F(ServiceTest, AllAttemptsFailingFailsTheRun) {
  make_service(
      R"({"name": "w", "steps": [{"name": "s", "type": "model", "model": "a", "fallback_model": "b",
                   "retries": 1, "prompt": "p"}, {"name": "t", "type": "model", "model": "a", "prompt": "q",
                   "after": ["s"]}]})",
      [](const json&) {
        Answer a;
        a.status = 502;
        return a;
      });
  const Events e = post({{"run_id", "r4"}});
  ASSERT_EQ(e.named("run_failed").size(), 1u);
  EXPECT_EQ(e.named("run_failed")[0]["step"], "s");
  EXPECT_EQ(requests().size(), 4u);  // 2 on a, 2 on b; t never sent
  const json s = state("r4");
  EXPECT_EQ(s["status"], "failed");
  EXPECT_EQ(s["steps"][0]["status"], "failed");
  EXPECT_EQ(s["steps"][1]["status"], "pending");
}

TEST_F(ServiceTest, AnAttemptPastItsTimeoutIsAbortedAndRetried) {
  std::atomic<int> calls{0};
  make_service(
      R"({"name": "w", "steps": [{"name": "s", "type": "model", "model": "a", "timeout_s": 0.1,
                   "retries": 1, "prompt": "p"}]})",
      [&](const json&) {
        Answer a;
        a.endless = ++calls == 1;
        a.pieces = {"late"};
        return a;
      });
  const Events e = post({{"run_id", "r5"}});
  ASSERT_EQ(e.named("run_completed").size(), 1u);
  ASSERT_EQ(e.named("step_retry").size(), 1u);
  EXPECT_EQ(e.named("step_retry")[0]["error"], "timed out after 0.1 s");
  EXPECT_EQ(aborted_->load(), 1);  // the stalled request was cut: its replica frees the KV
}

TEST_F(ServiceTest, AMapKeepsItsConcurrencyAndItsOrder) {
  make_service(R"({"name": "w", "input": {"items": "array"}, "steps": [
                   {"name": "m", "type": "map", "over": "{{ input.items }}", "concurrency": 3,
                    "step": {"type": "model", "model": "a", "prompt": "{{ index }}={{ item }}"}}]})",
               [](const json& body) {
                 Answer a;
                 const std::string prompt = body["prompt"];
                 a.pieces = {"<" + prompt + ">"};
                 // Later items finish first: the output keeps the list's order.
                 a.delay = std::chrono::milliseconds(60 - 5 * (prompt[0] - '0'));
                 return a;
               });
  const Events e =
      post({{"run_id", "r6"}, {"input", {{"items", {"a", "b", "c", "d", "e", "f", "g", "h"}}}}});
  ASSERT_EQ(e.named("run_completed").size(), 1u);
  EXPECT_EQ(e.named("run_completed")[0]["output"],
            json::parse(R"(["<0=a>","<1=b>","<2=c>","<3=d>","<4=e>","<5=f>","<6=g>","<7=h>"])"));
  EXPECT_EQ(max_running_.load(), 3);
  EXPECT_EQ(e.named("step_result").size(), 9u);  // 8 items, then the step
  EXPECT_EQ(state("r6")["steps"][0]["items_done"], 8);
}

TEST_F(ServiceTest, AMapOverSomethingNotAListFailsTheRunNamingIt) {
  make_service(R"({"name": "w", "steps": [{"name": "m", "type": "map", "over": "{{ input.items }}",
                   "step": {"type": "model", "model": "a", "prompt": "{{ item }}"}}]})",
               [](const json&) { return Answer{}; });
  const Events e = post({{"run_id", "r7"}, {"input", {{"items", "text"}}}});
  ASSERT_EQ(e.named("run_failed").size(), 1u);
  EXPECT_EQ(e.named("run_failed")[0]["error"],
            "over: must be a list of at most 1024 items, not string");
  const Events missing = post({{"run_id", "r7b"}, {"input", json::object()}});
  ASSERT_EQ(missing.named("run_failed").size(), 1u);
  EXPECT_EQ(missing.named("run_failed")[0]["error"],
            "over: 'input.items' does not resolve: input has no field 'items'");
}

TEST_F(ServiceTest, AConditionRunsOneBranchAndSkipsTheOther) {
  make_service(R"({"name": "w", "input": {"kind": "string"}, "steps": [
                   {"name": "is_bug", "type": "condition", "if": {"equals": ["{{ input.kind }}", "bug"]},
                    "then": ["fix"], "else": ["answer"]},
                   {"name": "fix", "type": "model", "model": "a", "prompt": "fix"},
                   {"name": "answer", "type": "model", "model": "a", "prompt": "answer"},
                   {"name": "report", "type": "model", "model": "a",
                    "prompt": "{{ steps.fix.output }}/{{ steps.answer.output }}"}]})",
               [](const json& body) {
                 Answer a;
                 a.pieces = {body["prompt"].get<std::string>()};
                 return a;
               });
  const Events e = post({{"run_id", "r8"}, {"input", {{"kind", "bug"}}}});
  ASSERT_EQ(e.named("run_completed").size(), 1u);
  EXPECT_EQ(e.named("run_completed")[0]["output"], "fix/null");  // a skipped step's output is null
  ASSERT_EQ(e.named("step_skipped").size(), 1u);
  EXPECT_EQ(e.named("step_skipped")[0]["step"], "answer");
  const json s = state("r8");
  EXPECT_EQ(s["steps"][0]["output"], true);
  EXPECT_EQ(s["steps"][2]["status"], "skipped");
}

TEST_F(ServiceTest, JsonFormatsAreParsedAndToolCallsAssembled) {
  make_service(
      R"({"name": "w", "steps": [
                   {"name": "j", "type": "model", "model": "json", "messages": [{"role": "user", "content": "x"}],
                    "response_format": {"type": "json_object"}},
                   {"name": "t", "type": "model", "model": "tools", "messages": [{"role": "user", "content": "x"}],
                    "tools": [{"type": "function", "function": {"name": "f"}}], "after": ["j"]}]})",
      [](const json& body) {
        Answer a;
        if (body["model"] == "json") {
          a.pieces = {"{\"category\"", ": \"bug\"}"};
        } else {
          a.raw_events =
              R"(data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]})"
              "\n\n"
              R"(data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\""}}]}}]})"
              "\n\n"
              R"(data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":": 1}"}}]}}]})"
              "\n\n";
        }
        return a;
      });
  const Events e = post({{"run_id", "r9"}});
  ASSERT_EQ(e.named("run_completed").size(), 1u) << e.list.back().second.dump();
  const json s = state("r9");
  EXPECT_EQ(s["steps"][0]["output"], (json{{"category", "bug"}}));
  EXPECT_EQ(s["steps"][1]["output"],
            json::parse(R"({"content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                     "function": {"name": "f", "arguments": "{\"a\": 1}"}}]})"));
}

TEST_F(ServiceTest, TextThatIsNotTheJsonAskedForFailsTheAttempt) {
  make_service(
      R"({"name": "w", "steps": [{"name": "j", "type": "model", "model": "a", "prompt": "x",
                   "response_format": {"type": "json_object"}}]})",
      [](const json&) {
        Answer a;
        a.pieces = {"not json"};
        return a;
      });
  const Events e = post({{"run_id", "r10"}});
  ASSERT_EQ(e.named("run_failed").size(), 1u);
  EXPECT_EQ(e.named("run_failed")[0]["error"],
            "the answer is not the JSON its response_format asked for: not json");
}

TEST_F(ServiceTest, AClientThatGoesAwayCancelsItsRun) {
  make_service(
      R"({"name": "w", "steps": [{"name": "s", "type": "model", "model": "a", "prompt": "p"}]})",
      [](const json&) {
        Answer a;
        a.endless = true;
        return a;
      });
  post({{"run_id", "r11"}}, 2);  // run, step_started: then gone
  for (int i = 0; i < 200 && aborted_->load() == 0; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(aborted_->load(), 1);
  EXPECT_EQ(state("r11")["status"], "cancelled");
  EXPECT_NE(service_->metrics_text().find("basalt_route_workflow_runs_in_progress 0"),
            std::string::npos);
}

TEST_F(ServiceTest, TokensWaitingForASlowClientAreBounded) {
  make_service(
      R"({"name": "w", "steps": [{"name": "s", "type": "model", "model": "a", "prompt": "p"}]})",
      [](const json&) {
        Answer a;
        a.pieces.assign(3000, std::string(1000, 'x'));
        return a;
      });
  // The client reads once the run has ended: every event waited for it.
  const Events e = post({{"run_id", "slow"}}, 0, nullptr,
                        [this] { return state("slow")["status"] == "completed"; });
  ASSERT_EQ(e.named("run_completed").size(), 1u);
  size_t token_bytes = 0;
  for (const json& t : e.named("token")) token_bytes += t["text"].get<std::string>().size();
  EXPECT_LT(token_bytes, size_t{1200} * 1000);  // about 1 MiB of events, not 3 MB
  EXPECT_GT(token_bytes, 0u);
  EXPECT_EQ(e.named("step_result")[0]["output"].get<std::string>().size(), 3000u * 1000);
}

TEST_F(ServiceTest, WithoutStreamTheAnswerIsTheStateAtTheEnd) {
  make_service(kTwoSteps, [](const json&) {
    Answer a;
    a.pieces = {"a", "b"};
    return a;
  });
  HttpRequest request;
  request.method = "POST";
  request.path = request.target = "/v1/workflows/w/runs";
  request.body = R"({"run_id": "whole", "stream": false, "input": {"text": "x"}})";
  HandlerResult r = service_->handle(request);
  ASSERT_TRUE(r.producer);
  std::atomic<int> wakes{0};
  r.producer->start([&wakes] { ++wakes; });
  std::string body;
  for (int i = 0; i < 500; ++i) {
    ResponseProducer::Output out;
    r.producer->pull(out);
    EXPECT_TRUE(out.data.empty());
    if (out.head) {
      EXPECT_TRUE(out.done);
      body = out.head->body;
      break;
    }
    std::this_thread::sleep_for(2ms);
  }
  const json state = json::parse(body);
  EXPECT_EQ(state["status"], "completed");
  EXPECT_EQ(state["output"], "ab");
  EXPECT_EQ(state["steps"].size(), 2u);
}

TEST_F(ServiceTest, DefinitionsAreReplacedForNewRunsOnly) {
  make_service(kTwoSteps, [](const json& body) {
    Answer a;
    a.pieces = {body["model"].get<std::string>()};
    return a;
  });
  std::string second = kTwoSteps;
  second.replace(second.find(R"("model": "a")"), 12, R"("model": "b")");
  std::map<std::string, std::shared_ptr<const Workflow>> defs;
  defs["w"] = std::make_shared<const Workflow>(parse_workflow(second, "second"));
  service_->set_workflows(defs);
  const Events e = post({{"run_id", "new"}, {"input", {{"text", "x"}}}});
  ASSERT_EQ(e.named("step_result").size(), 2u);
  EXPECT_EQ(e.named("step_result")[0]["output"], "b");  // the new definition's first step
  // A host that does not resolve: refused, the definitions kept.
  const std::string bad = R"({"name": "w", "steps": [{"name": "h", "type": "http",
                             "url": "http://no-such-host.invalid/x"}]})";
  defs["w"] = std::make_shared<const Workflow>(parse_workflow(bad, "bad"));
  EXPECT_THROW(service_->set_workflows(defs), Error);
  HttpRequest list;
  list.method = "GET";
  list.path = list.target = "/v1/workflows";
  EXPECT_EQ(json::parse(service_->handle(list).response.body)["data"][0]["steps"][0]["model"], "b");
}

TEST_F(ServiceTest, BadRequestsAreRefused) {
  make_service(kTwoSteps, [](const json&) { return Answer{}; });
  int status = 0;
  post({{"input", {{"text", 1}}}}, 0, &status);
  EXPECT_EQ(status, 400);
  post({{"input", {{"text", "x"}}}, {"run_id", "../etc"}}, 0, &status);
  EXPECT_EQ(status, 400);
  post({{"input", {{"text", "x"}}}, {"extra", 1}}, 0, &status);
  EXPECT_EQ(status, 400);
  post({{"input", {{"text", "x"}}}, {"stream", "yes"}}, 0, &status);
  EXPECT_EQ(status, 400);
  HttpRequest get;
  get.method = "GET";
  get.path = get.target = "/v1/workflows/w/runs/none";
  EXPECT_EQ(service_->handle(get).response.status, 404);
  get.path = get.target = "/v1/workflows/other/runs";
  EXPECT_EQ(service_->handle(get).response.status, 404);
  get.path = get.target = "/v1/workflows";
  const HandlerResult list = service_->handle(get);
  EXPECT_EQ(json::parse(list.response.body)["data"][0]["name"], "w");
}

TEST_F(ServiceTest, TheStateDirectoryResumesARunWithoutResendingFinishedSteps) {
  state_dir_ =
      (std::filesystem::temp_directory_path() / ("basalt_wf_state_" + std::to_string(::getpid())))
          .string();
  std::atomic<bool> second_fails{true};
  const auto answer = [&](const json& body) {
    Answer a;
    if (body.contains("prompt") && second_fails) a.status = 400;
    a.pieces = {body.contains("prompt") ? "two" : "one"};
    return a;
  };
  make_service(kTwoSteps, answer, state_dir_);
  const Events failed = post({{"run_id", "r12"}, {"input", {{"text", "hi"}}}});
  ASSERT_EQ(failed.named("run_failed").size(), 1u);
  ASSERT_EQ(requests().size(), 2u);
  // A crash cut the last record short: it is dropped, and the file mended.
  { std::ofstream(state_dir_ + "/r12.jsonl", std::ios::app) << R"({"kind":"ite)"; }
  { std::ofstream(state_dir_ + "/garbage.jsonl") << "not json\n"; }
  service_.reset();
  requests_.clear();
  second_fails = false;
  make_service(kTwoSteps, answer, state_dir_);
  EXPECT_EQ(service_->replayed_runs(), 1u);
  EXPECT_EQ(state("r12")["status"], "failed");
  int status = 0;
  post({{"run_id", "r12"}, {"input", {{"text", "other"}}}}, 0, &status);
  EXPECT_EQ(status, 409);  // another input under the same id
  const Events resumed = post({{"run_id", "r12"}, {"input", {{"text", "hi"}}}});
  ASSERT_EQ(resumed.named("run_completed").size(), 1u);
  EXPECT_EQ(resumed.named("run_completed")[0]["output"], "two");
  EXPECT_EQ(resumed.named("step_result")[0],
            (json{{"step", "first"},
                  {"output", "one"},
                  {"seconds", resumed.named("step_result")[0]["seconds"]},
                  {"attempts", 1},
                  {"replayed", true}}));
  ASSERT_EQ(requests().size(), 1u);  // only the second step was sent again
  EXPECT_EQ(json::parse(requests()[0].body)["prompt"], "one!");
  // The record now ends completed, and a third service sees it so.
  service_.reset();
  make_service(kTwoSteps, answer, state_dir_);
  EXPECT_EQ(state("r12")["status"], "completed");
  EXPECT_EQ(state("r12")["output"], "two");
  // Posted again once completed: its record, nothing sent.
  requests_.clear();
  const Events again = post({{"run_id", "r12"}, {"input", {{"text", "hi"}}}});
  ASSERT_EQ(again.named("run_completed").size(), 1u);
  EXPECT_EQ(again.named("run_completed")[0]["output"], "two");
  EXPECT_EQ(again.named("step_result").size(), 2u);
  EXPECT_TRUE(again.named("step_started").empty());
  EXPECT_TRUE(requests().empty());
  EXPECT_EQ(state("r12")["status"], "completed");
}

TEST_F(ServiceTest, AnHttpStepCallsTheServiceWithItsRenderedBody) {
  HttpServerOptions server_options;
  server_options.port = 0;
  server_options.io_threads = 1;
  std::string seen_header;
  HttpServer server(server_options, [&](HttpRequest& request) {
    if (request.path == "/echo") seen_header = std::string(request.header("x-ticket").value_or(""));
    HandlerResult r;
    r.response.status = request.path == "/echo" ? 200 : 500;
    r.response.body = json{{"got", json::parse(request.body)}, {"query", request.target}}.dump();
    return r;
  });
  server.start();
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port());
  make_service(R"({"name": "w", "input": {"t": "string"}, "steps": [
                   {"name": "h", "type": "http", "url": ")" +
                   url + R"(/echo?a=1",
                    "headers": {"X-Ticket": "{{ input.t }}"}, "body": {"list": ["{{ input.t }}", 2]}},
                   {"name": "bad", "type": "http", "url": ")" +
                   url + R"(/fail", "after": ["h"]}]})",
               [](const json&) { return Answer{}; });
  const Events e = post({{"run_id", "r13"}, {"input", {{"t", "T-1"}}}});
  ASSERT_EQ(e.named("run_failed").size(), 1u);
  EXPECT_EQ(e.named("run_failed")[0]["step"], "bad");
  EXPECT_EQ(e.named("run_failed")[0]["error"].get<std::string>().rfind("HTTP 500", 0), 0u);
  EXPECT_EQ(state("r13")["steps"][0]["output"],
            json::parse(R"({"got": {"list": ["T-1", 2]}, "query": "/echo?a=1"})"));
  EXPECT_EQ(seen_header, "T-1");
  server.stop();
}

}  // namespace
}  // namespace basalt::workflow

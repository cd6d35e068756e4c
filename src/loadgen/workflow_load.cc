// Workflow runs as load: see workflow_load.h.
#include "loadgen/workflow_load.h"

#include <fmt/format.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <memory>

#include "loadgen/stats.h"
#include "server/sse.h"

namespace basalt::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

struct Driver : std::enable_shared_from_this<Driver> {
  boost::asio::io_context& io;
  HttpClient& client;
  const WorkflowLoadOptions& options;
  Clock::time_point start = Clock::now();
  std::vector<double> due;
  WorkflowLoadResult result;
  std::deque<size_t> waiting;  // due, held by the concurrency limit
  int64_t open = 0;
  boost::asio::steady_timer timer;
  size_t next_due = 0;

  Driver(boost::asio::io_context& io_context, HttpClient& http, const WorkflowLoadOptions& o)
      : io(io_context), client(http), options(o), timer(io_context) {}

  double now_s() const { return std::chrono::duration<double>(Clock::now() - start).count(); }

  // Sends what is due and schedules the next wake-up.
  void pump() {
    const double now = now_s();
    while (next_due < due.size() && due[next_due] <= now) waiting.push_back(next_due++);
    while (!waiting.empty() && (options.max_concurrency <= 0 || open < options.max_concurrency)) {
      send(waiting.front());
      waiting.pop_front();
    }
    if (next_due < due.size()) {
      timer.expires_after(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(std::max(0.0, due[next_due] - now))));
      timer.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
        if (!ec) self->pump();
      });
    }
  }

  void send(size_t i) {
    ++open;
    WorkflowRunRecord& r = result.records[i];
    r.scheduled_s = due[i];
    r.sent_s = now_s();
    OutgoingRequest request;
    request.method = "POST";
    request.path = options.path;
    request.body = options.body;
    request.headers.emplace_back("Content-Type", "application/json");
    request.headers.emplace_back("Accept", "text/event-stream");
    if (!options.api_key.empty())
      request.headers.emplace_back("Authorization", "Bearer " + options.api_key);
    // The events' names: `event:` lines are not in SseParser's data, so
    // each event's raw bytes are read for them.
    auto parser = std::make_shared<SseParser>([](std::string_view) {});
    auto status = std::make_shared<int>(0);
    auto body = std::make_shared<std::string>();
    auto self = shared_from_this();
    parser->on_raw([self, i](std::string_view raw) {
      WorkflowRunRecord& rec = self->result.records[i];
      if (raw.rfind("event: step_result", 0) == 0 && rec.first_result_s < 0)
        rec.first_result_s = self->now_s();
      if (raw.rfind("event: run_completed", 0) == 0) rec.ok = true;
      if (raw.rfind("event: run_failed", 0) == 0) {
        const size_t data = raw.find("data: ");
        rec.error = "run_failed: " +
                    std::string(raw.substr(data == std::string_view::npos ? 0 : data + 6, 300));
        while (!rec.error.empty() && (rec.error.back() == '\n' || rec.error.back() == '\r'))
          rec.error.pop_back();
      }
    });
    ExchangeCallbacks callbacks;
    callbacks.on_head = [status](const IncomingHead& head) { *status = head.status; };
    callbacks.on_data = [parser, status, body](std::string_view bytes) {
      if (*status == 200)
        parser->feed(bytes);
      else if (body->size() < 512)
        body->append(bytes.substr(0, 512 - body->size()));
    };
    callbacks.on_done = [self, i, status, body, parser](HttpFailure failure,
                                                        const std::string& message) {
      WorkflowRunRecord& rec = self->result.records[i];
      rec.end_s = self->now_s();
      if (failure != HttpFailure::kNone) {
        rec.ok = false;
        rec.error = fmt::format("{}: {}", http_failure_name(failure), message);
      } else if (*status != 200) {
        rec.ok = false;
        rec.error = fmt::format("HTTP {}: {}", *status, *body);
      } else if (!rec.ok && rec.error.empty()) {
        rec.error = "the stream ended without run_completed or run_failed";
      }
      --self->open;
      self->pump();
    };
    client.send(std::move(request), std::move(callbacks));
  }
};

}  // namespace

WorkflowLoadResult run_workflow_load(boost::asio::io_context& io, HttpClient& client,
                                     const WorkflowLoadOptions& options) {
  auto driver = std::make_shared<Driver>(io, client, options);
  driver->due = arrival_times(options.runs, options.shape);
  driver->result.records.resize(driver->due.size());
  driver->start = Clock::now();
  boost::asio::post(io, [driver] { driver->pump(); });
  io.restart();
  io.run();
  driver->result.wall_s = driver->now_s();
  return std::move(driver->result);
}

nlohmann::json summarize_workflow_load(const WorkflowLoadResult& result) {
  std::vector<double> e2e, first;
  int64_t failed = 0;
  nlohmann::json errors = nlohmann::json::object();
  for (const WorkflowRunRecord& r : result.records) {
    if (!r.ok) {
      ++failed;
      const std::string kind = r.error.substr(0, r.error.find(':'));
      errors[kind] = errors.value(kind, 0) + 1;
      continue;
    }
    e2e.push_back(r.end_s - r.sent_s);
    if (r.first_result_s >= 0) first.push_back(r.first_result_s - r.sent_s);
  }
  const auto block = [](const std::vector<double>& values) {
    const Summary s = summarize(values);
    return nlohmann::json{{"count", s.count}, {"mean", s.mean}, {"min", s.min}, {"p50", s.median},
                          {"p90", s.p90},     {"p95", s.p95},   {"p99", s.p99}, {"max", s.max}};
  };
  const int64_t completed = static_cast<int64_t>(e2e.size());
  return {{"runs", result.records.size()},
          {"completed", completed},
          {"failed", failed},
          {"errors", errors},
          {"wall_s", result.wall_s},
          {"completed_per_s", result.wall_s > 0 ? completed / result.wall_s : 0.0},
          {"e2e_s", block(e2e)},
          {"first_result_s", block(first)}};
}

std::string workflow_load_table(const nlohmann::json& s, const std::string& title) {
  std::string out = fmt::format("{}\n", title);
  out += fmt::format("  runs {}  completed {}  failed {}  wall {:.2f} s  {:.2f} completed/s\n",
                     s["runs"].get<int64_t>(), s["completed"].get<int64_t>(),
                     s["failed"].get<int64_t>(), s["wall_s"].get<double>(),
                     s["completed_per_s"].get<double>());
  out += fmt::format("  {:<22}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}\n", "seconds", "mean", "p50",
                     "p90", "p95", "p99", "max");
  for (const auto& [name, key] :
       {std::pair{"end to end", "e2e_s"}, std::pair{"first step result", "first_result_s"}}) {
    const nlohmann::json& b = s[key];
    out += fmt::format("  {:<22}{:>10.3f}{:>10.3f}{:>10.3f}{:>10.3f}{:>10.3f}{:>10.3f}\n", name,
                       b["mean"].get<double>(), b["p50"].get<double>(), b["p90"].get<double>(),
                       b["p95"].get<double>(), b["p99"].get<double>(), b["max"].get<double>());
  }
  for (const auto& [kind, n] : s["errors"].items())
    out += fmt::format("  error {}: {}\n", kind, n.get<int64_t>());
  return out;
}

}  // namespace basalt::loadgen

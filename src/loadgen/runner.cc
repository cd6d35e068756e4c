#include "loadgen/runner.h"

#include <sys/resource.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdio>
#include <deque>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace basalt::loadgen {

namespace asio = boost::asio;
using nlohmann::json;

std::string build_body(const Conversation& conversation, size_t turn, const std::vector<std::string>& answers,
                       const RunOptions& options) {
  BASALT_ASSERT(turn < conversation.turns.size() && answers.size() >= turn);
  json body = json::object();
  if (!options.model.empty()) body["model"] = options.model;
  if (options.chat) {
    json messages = json::array();
    for (const Message& m : conversation.leading) messages.push_back({{"role", m.role}, {"content", m.content}});
    for (size_t k = 0; k < turn; ++k) {
      messages.push_back({{"role", "user"}, {"content", conversation.turns[k].question}});
      messages.push_back({{"role", "assistant"}, {"content", answers[k]}});
    }
    messages.push_back({{"role", "user"}, {"content", conversation.turns[turn].question}});
    body["messages"] = std::move(messages);
  } else {
    std::string prompt;
    auto add = [&prompt](const std::string& text) {
      if (!prompt.empty()) prompt += "\n\n";
      prompt += text;
    };
    for (const Message& m : conversation.leading) add(m.content);
    for (size_t k = 0; k < turn; ++k) {
      add(conversation.turns[k].question);
      add(answers[k]);
    }
    add(conversation.turns[turn].question);
    body["prompt"] = std::move(prompt);
  }
  body["max_tokens"] = conversation.turns[turn].max_tokens;
  body["stream"] = true;
  if (options.include_usage) body["stream_options"] = {{"include_usage", true}};
  if (options.temperature >= 0) body["temperature"] = options.temperature;
  if (options.ignore_eos) body["ignore_eos"] = true;
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

double cpu_seconds(const timeval& tv) { return static_cast<double>(tv.tv_sec) + tv.tv_usec * 1e-6; }

class Run {
 public:
  Run(asio::io_context& io, CompletionClient& client, const std::vector<Conversation>& conversations,
      const RunOptions& options)
      : io_(io),
        client_(client),
        conversations_(conversations),
        options_(options),
        arrival_timer_(io),
        progress_timer_(io),
        answers_(conversations.size()),
        tokens_in_answers_(conversations.size(), 0) {
    for (const Conversation& c : conversations) total_requests_ += static_cast<int64_t>(c.turns.size());
    arrivals_ = arrival_times(static_cast<int64_t>(conversations.size()), options.shape);
    tty_ = ::isatty(STDERR_FILENO) == 1;
  }

  RunResult go() {
    rusage before{}, after{};
    ::getrusage(RUSAGE_SELF, &before);
    epoch_ = Clock::now();
    client_.set_epoch(epoch_);
    io_.restart();
    asio::post(io_, [this] { on_arrivals(); });
    if (options_.progress) arm_progress();
    io_.run();
    ::getrusage(RUSAGE_SELF, &after);
    result_.wall_s = last_end_s_;
    result_.cpu_user_s = cpu_seconds(after.ru_utime) - cpu_seconds(before.ru_utime);
    result_.cpu_system_s = cpu_seconds(after.ru_stime) - cpu_seconds(before.ru_stime);
    if (options_.progress) {
      print_progress();
      if (tty_) std::fputc('\n', stderr);
    }
    client_.close_idle();
    return std::move(result_);
  }

 private:
  struct Ready {
    size_t conversation;
    size_t turn;
    double scheduled_s;
    bool on_schedule;
    bool held = false;  // waited for a slot
  };

  double now_s() const { return std::chrono::duration<double>(Clock::now() - epoch_).count(); }

  void on_arrivals() {
    const double now = now_s();
    while (next_arrival_ < arrivals_.size() && arrivals_[next_arrival_] <= now) {
      // With no rate every request is due at 0: lag would only measure how
      // long sending them all takes, so it is measured for rated runs only.
      ready_.push_back({next_arrival_, 0, arrivals_[next_arrival_], !options_.shape.unlimited()});
      ++next_arrival_;
    }
    pump();
    if (next_arrival_ < arrivals_.size()) {
      arrival_timer_.expires_at(epoch_ + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(arrivals_[next_arrival_])));
      arrival_timer_.async_wait([this](boost::system::error_code ec) {
        if (!ec) on_arrivals();
      });
    }
    check_finished();
  }

  void pump() {
    while (!ready_.empty() && (options_.max_concurrency <= 0 || in_flight_ < options_.max_concurrency)) {
      Ready r = ready_.front();
      ready_.pop_front();
      start(r);
    }
    // What is left waits for a slot: its lag is the limit's doing, not the client's.
    for (Ready& r : ready_) {
      if (!r.held) {
        r.held = true;
        r.on_schedule = false;
        ++result_.held_by_limit;
      }
    }
  }

  void start(const Ready& r) {
    const Conversation& c = conversations_[r.conversation];
    RequestRecord rec;
    rec.conversation = static_cast<int64_t>(r.conversation);
    rec.turn = static_cast<int64_t>(r.turn);
    rec.scheduled_s = r.scheduled_s;
    rec.on_schedule = r.on_schedule;
    rec.input_tokens = c.leading_tokens + tokens_in_answers_[r.conversation];
    for (size_t k = 0; k <= r.turn; ++k) rec.input_tokens += c.turns[k].question_tokens;
    rec.max_tokens = c.turns[r.turn].max_tokens;
    const size_t index = result_.records.size();
    result_.records.push_back(std::move(rec));
    ++in_flight_;
    const bool more_turns = r.turn + 1 < c.turns.size();
    client_.send("POST", options_.path, build_body(c, r.turn, answers_[r.conversation], options_), true, more_turns,
                 [this, index, r](ExchangeResult&& res) { on_done(index, r, std::move(res)); });
  }

  void on_done(size_t index, const Ready& r, ExchangeResult&& res) {
    --in_flight_;
    ++finished_;
    RequestRecord& rec = result_.records[index];
    if (rec.on_schedule) rec.lag_s = std::max(0.0, res.sent_s - rec.scheduled_s);
    last_end_s_ = std::max(last_end_s_, res.end_s);
    if (res.error == ErrorKind::kNone) ++ok_;
    else ++errors_;
    output_tokens_ += res.usage_completion_tokens >= 0 ? res.usage_completion_tokens : res.chunk_tokens;
    const Conversation& c = conversations_[r.conversation];
    if (r.turn + 1 < c.turns.size()) {
      if (res.error == ErrorKind::kNone) {
        tokens_in_answers_[r.conversation] +=
            res.usage_completion_tokens >= 0 ? res.usage_completion_tokens : res.chunk_tokens;
        answers_[r.conversation].push_back(std::move(res.text));
        ready_.push_front({r.conversation, r.turn + 1, res.end_s, false});
      } else {
        const int64_t left = static_cast<int64_t>(c.turns.size() - r.turn - 1);
        result_.abandoned_turns += left;
        total_requests_ -= left;
      }
    }
    res.text.clear();
    res.text.shrink_to_fit();
    rec.result = std::move(res);
    pump();
    check_finished();
  }

  void check_finished() {
    if (next_arrival_ < arrivals_.size() || in_flight_ > 0 || !ready_.empty()) return;
    arrival_timer_.cancel();
    progress_timer_.cancel();
  }

  void arm_progress() {
    progress_timer_.expires_after(tty_ ? std::chrono::milliseconds(250) : std::chrono::milliseconds(10000));
    progress_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      print_progress();
      arm_progress();
    });
  }

  void print_progress() {
    const double t = now_s();
    const double tok_s = t > 0 ? static_cast<double>(output_tokens_) / t : 0;
    if (tty_) {
      const int width = 30;
      const double frac = total_requests_ > 0 ? static_cast<double>(finished_) / static_cast<double>(total_requests_) : 1;
      const int filled = static_cast<int>(frac * width);
      std::string bar(static_cast<size_t>(filled), '#');
      bar.resize(width, '.');
      std::fprintf(stderr, "\r%s [%s] %lld/%lld done, %lld running, %lld errors, %.0f tok/s, %.1f s ",
                   options_.label.c_str(), bar.c_str(), static_cast<long long>(finished_),
                   static_cast<long long>(total_requests_), static_cast<long long>(in_flight_),
                   static_cast<long long>(errors_), tok_s, t);
    } else {
      std::fprintf(stderr, "%s: %lld/%lld done, %lld running, %lld errors, %.0f tok/s, %.1f s\n",
                   options_.label.c_str(), static_cast<long long>(finished_), static_cast<long long>(total_requests_),
                   static_cast<long long>(in_flight_), static_cast<long long>(errors_), tok_s, t);
    }
    std::fflush(stderr);
  }

  asio::io_context& io_;
  CompletionClient& client_;
  const std::vector<Conversation>& conversations_;
  const RunOptions& options_;
  asio::steady_timer arrival_timer_;
  asio::steady_timer progress_timer_;
  std::vector<double> arrivals_;
  size_t next_arrival_ = 0;
  std::deque<Ready> ready_;
  std::vector<std::vector<std::string>> answers_;
  std::vector<int64_t> tokens_in_answers_;
  Clock::time_point epoch_;
  int64_t in_flight_ = 0;
  int64_t finished_ = 0;
  int64_t ok_ = 0;
  int64_t errors_ = 0;
  int64_t total_requests_ = 0;
  int64_t output_tokens_ = 0;
  double last_end_s_ = 0;
  bool tty_ = false;
  RunResult result_;
};

}  // namespace

RunResult run_load(asio::io_context& io, CompletionClient& client, const std::vector<Conversation>& conversations,
                   const RunOptions& options) {
  BASALT_CHECK(options.max_concurrency >= 0, "--max-concurrency must be >= 0 (0: no limit), got {}",
               options.max_concurrency);
  Run run(io, client, conversations, options);
  return run.go();
}

}  // namespace basalt::loadgen

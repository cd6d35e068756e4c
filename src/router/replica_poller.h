// ReplicaPoller: every `interval`, a GET of one path from each listed
// replica, and its answer (or that it failed) handed to a callback. The
// health checker (/ready, router/health.h) and the metrics scraper
// (/metrics, router/replica_metrics.h) are two of them.
//
// Contract: runs on the io_context it is given; one request per replica at
// a time (a replica whose last answer is still out is skipped that round);
// start() and stop() from any thread; stop() (also the destructor) ends
// the rounds and cancels the requests out. `on_answer` runs on an io
// thread, outside the poller's lock, once per request that was not
// cancelled: with the status and body (at most max_body_bytes) when the
// replica answered, with none when it could not be reached, timed out,
// broke off or sent more than max_body_bytes; a replica whose host does
// not resolve gets none each round.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "router/replica_registry.h"

namespace boost::asio {
class io_context;
}

namespace basalt::router {

struct PollOptions {
  std::string path;
  std::chrono::milliseconds interval{1000};
  std::chrono::milliseconds timeout{1000};
  size_t max_body_bytes = 1 << 16;
};

struct PollAnswer {
  int status = 0;
  std::string body;
};

class ReplicaPoller {
 public:
  using OnAnswer = std::function<void(ReplicaState& state, const std::optional<PollAnswer>& answer)>;

  ReplicaPoller(ReplicaRegistry& registry, boost::asio::io_context& io, PollOptions options, OnAnswer on_answer);
  ~ReplicaPoller();
  ReplicaPoller(const ReplicaPoller&) = delete;
  ReplicaPoller& operator=(const ReplicaPoller&) = delete;
  void start();
  void stop();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace basalt::router

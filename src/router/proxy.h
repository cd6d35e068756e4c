// The gateway's forwarding of one client request to its replicas
// (docs/ROUTER.md §3, "before the first byte").
//
// ReplicaClients keeps one HttpClient (keep-alive pool) per replica, made
// the first time a request goes there, on the gateway's client io_context.
//
// ProxyProducer is the response the gateway gives the HTTP transport for a
// request it forwards. It sends the request to the replica `pick` chooses
// and passes the answer back:
//  * a stream (text/event-stream) event by event, each complete event as
//    the replica sent its bytes (SSE comments, heartbeats among them, are
//    not passed on), the head as soon as the replica's 200 head arrives;
//  * anything else whole, status and body as the replica sent them.
// Before anything reached the client it tries another replica (never one
// tried for this request), up to max_attempts in all, when the connection
// fails or breaks, or the replica answers 429, 502, 503 or 504 (its answer
// is passed on when no attempt is left); other statuses (400, 404, ...) are
// the request's own and are passed on at once. A stream that breaks after
// its head was sent ends with an error event (code "upstream_failed") and
// `data: [DONE]`, unless the request may fail over: then (ROUTER.md §3)
// the stream is resumed on another replica from the tokens the client has
// (the `: basalt` comments the replica writes with X-Basalt-Resume-Info,
// applied as their events go out), with the same body and seed plus
// `basalt_resume` (a choice the client has no chunk of listed as not
// announced, so its role delta or echo still comes; the first attempt's
// cached prompt tokens, once a comment said them, as prior_usage), and the
// client sees one stream. Triggers: the
// connection ends before `data: [DONE]` or breaks, an error event with
// code cut_by_server (not passed on), or no byte for the stall timeout
// (heartbeats are asked for, a quarter of it, so a slow replica is not
// taken for a stalled one); at most max_failovers times. With no replica
// to try the client gets 503 (none was available, or the request's
// no_replica_message) or 502 (every attempt failed), as an OpenAI error body.
//
// Contract: the producer's state is shared with the client callbacks
// (which run on the replica client's strand), so either side may go first;
// abort() cancels the exchange in flight and the replica sees its client
// go away. Each attempt counts in the replica's ReplicaState (in flight,
// and sent since its last scrape)
// while it runs, and `observe` (when set) hears how each attempt and the
// request ended, from the thread that ended them. Each attempt is a span of
// the request's trace, when it has one (ProxyRequest::trace). The time the
// gateway holds each relayed event, or a whole answer's body, goes to
// ProxyRequest::added_latency (when set).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "router/replica_registry.h"
#include "router/trace_context.h"
#include "server/http_client.h"
#include "server/http_server.h"

namespace basalt::router {

class ReplicaClients {
 public:
  ReplicaClients(boost::asio::io_context& io, HttpClientOptions options);
  ~ReplicaClients();
  HttpClient& of(const ReplicaSpec& replica);
  boost::asio::io_context& io() { return io_; }

 private:
  boost::asio::io_context& io_;
  HttpClientOptions options_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<HttpClient>, std::less<>> clients_;
};

// Seconds the gateway itself held an answer's bytes (ROUTER.md §6,
// `basalt_route_added_latency_seconds`), from the replica client's callback
// that delivered the last byte of a relayed event (or of a whole answer's
// body) to the pull in which the client connection's transport takes them
// and starts its socket write. That includes the wait for the client's
// strand and for a write to that client still in progress; it excludes
// the kernel's socket buffers on either side. Per-bucket counters are
// relaxed atomics: any thread adds without a lock; a reader sees each
// counter's latest value (a scrape racing an add may see the bucket and
// not yet the sum).
class ResidenceHistogram {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kBounds[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                       0.01,    0.025,  0.05,    0.1,    0.25,  1};
  static constexpr size_t kBuckets = std::size(kBounds) + 1;  // the last: past every bound

  void add(Clock::duration held);
  struct Counts {
    std::array<uint64_t, kBuckets> buckets{};
    uint64_t count = 0;  // the buckets' total
    double sum = 0;      // seconds
  };
  Counts counts() const;

 private:
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<uint64_t> sum_ns_{0};
};

// The gateway's residence, by what was held.
struct AddedLatency {
  ResidenceHistogram event;  // a relayed stream event
  ResidenceHistogram body;   // a whole answer's body
};

// How one attempt on a replica ended.
enum class AttemptOutcome {
  kAnswered,     // the replica answered and the answer was used
  kBusy,         // 429 before anything reached the client
  kUnavailable,  // 502/503/504 before anything reached the client
  kUnreachable,  // no connection (refused, reset before any byte, no route)
  kFailed,       // the exchange broke, timed out, stalled or was cut by the server
  kCancelled,    // the client went away
};
const char* attempt_outcome_name(AttemptOutcome outcome);

struct ProxyObserver {
  std::function<void(const Replica&, AttemptOutcome)> attempt;
  // Another replica is about to be tried before anything reached the
  // client, because `from` ended its attempt as `why` (kBusy,
  // kUnavailable, kUnreachable or kFailed). Not called when no replica is
  // left, nor for a failover (a stream resumed after its head went out).
  std::function<void(const ReplicaSpec& from, AttemptOutcome why)> retry;
  // A stream resumed elsewhere after `replica` failed it: "eof" (ended or
  // broke before [DONE]), "stall" or "cut" (cut_by_server).
  std::function<void(const ReplicaSpec& replica, const char* reason)> failover;
  // A replica's head arrived (it began answering). Called under the
  // producer's lock: it must not call back into the producer.
  std::function<void()> head;
  // The first bytes of the answer went to the client (a stream's first
  // event, or a whole answer the replica gave), from `replica`. Called
  // under the producer's lock, at most once.
  std::function<void(const ReplicaSpec& replica)> first_byte;
  // The status the client got (a stream cut after its head counts as its
  // 200; a client gone before its answer was out, 499), the replicas
  // tried, in order (canonical ids), and the completion tokens the answer
  // had (its `usage`, else the tokens its resume comments named; -1 when
  // neither said). Exactly once per request.
  std::function<void(int status, const std::vector<std::string>& tried, int64_t completion_tokens)> finished;
};

// A stream the gateway may resume elsewhere: its body is a JSON object
// with `stream` and `seed` (the gateway fixes one).
struct FailoverOptions {
  bool enabled = false;
  int max_failovers = 2;
  std::chrono::milliseconds stall_timeout{10000};
};

struct ProxyRequest {
  OutgoingRequest upstream;  // what each attempt sends
  int max_attempts = 3;
  FailoverOptions failover;
  // The next replica to try, none tried before (`tried`: canonical ids);
  // null when none is left.
  std::function<std::shared_ptr<const Replica>(const std::vector<std::string>& tried)> pick;
  // When set, the request is answered 503 with this message (and the
  // last failure, if any) when no replica is left before its head, rather
  // than the generic 503 or the 502 of failed attempts: the gateway's
  // region constraint, which the client must hear about.
  std::string no_replica_message;
  // When set, each attempt carries a traceparent of this trace with a new
  // parent-id (router/trace_context.h), and its tracestate when it has one.
  std::optional<TraceContext> trace;
  ProxyObserver observe;
  // When set, the time each relayed event and whole answer spent in the
  // gateway is added here (ResidenceHistogram).
  std::shared_ptr<AddedLatency> added_latency;
};

class ProxyProducer : public ResponseProducer {
 public:
  ProxyProducer(ReplicaClients& clients, ProxyRequest request);
  ~ProxyProducer() override;
  void start(std::function<void()> wake) override;
  void pull(Output& out) override;
  void abort() override;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace basalt::router

// Delivery: hands each engine step's updates to their streams, and its KV
// events to their subscribers, on a thread of its own, so that the
// scheduling thread never takes a stream's lock or runs a client's callback
// (an HTTP server's listener posts to its event loop on every token).
//
// Contract: post() takes a batch (streams of new requests, then updates in
// the order the scheduler made them) and returns at once; batches are
// delivered in post order, and within a batch in order, so every stream sees
// its updates in order and a new request's stream is known before its first
// update. A finished update is a stream's last: delivery forgets the stream
// after it. A new KV-event subscriber gets its snapshot (seq 1), then, in
// order, the KV events of every later batch (seq 2, 3, ...); listeners are
// called on the delivery thread. flush() waits until everything posted so
// far is delivered. The destructor delivers what is posted, then stops.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/kv_events.h"
#include "runtime/request.h"
#include "runtime/request_stream.h"

namespace basalt {

using KvEventListener = std::function<void(const KvEventBatch&)>;

class Delivery {
 public:
  struct Subscription {
    uint64_t id = 0;
    KvEventListener listener;
    int32_t block_size = 0;
    std::vector<KvEvent> snapshot;
  };
  struct Batch {
    std::vector<std::pair<uint64_t, RequestHandle>> streams;  // new requests
    std::vector<RequestUpdate> updates;
    std::vector<Subscription> subscribe;  // before this batch's events
    std::vector<KvEvent> kv_events;
    std::vector<uint64_t> unsubscribe;  // after them
    bool empty() const {
      return streams.empty() && updates.empty() && subscribe.empty() && kv_events.empty() && unsubscribe.empty();
    }
  };

  Delivery();
  ~Delivery();
  Delivery(const Delivery&) = delete;
  Delivery& operator=(const Delivery&) = delete;

  void post(Batch batch);
  // An empty update vector that an earlier batch delivered, with its
  // capacity (or a new one): the poster fills it for its next batch, so a
  // step neither allocates its updates nor writes them to memory no cache
  // has seen (the delivery thread frees what they held).
  std::vector<RequestUpdate> spare_updates();
  void flush();
  // Detaches the streams still open (their engine is going away).
  void detach_all();

 private:
  void loop();
  void deliver_kv_events(Batch& batch);

  std::mutex mu_;
  std::condition_variable cv_;       // a batch or stop
  std::condition_variable idle_cv_;  // everything posted is delivered
  std::deque<Batch> queue_;
  std::vector<std::vector<RequestUpdate>> spare_;  // emptied, capacity kept; at most kSpares
  static constexpr size_t kSpares = 2;
  uint64_t posted_ = 0;
  uint64_t delivered_ = 0;
  bool stop_ = false;
  std::unordered_map<uint64_t, RequestHandle> streams_;  // the delivery thread's
  struct Subscriber {
    KvEventListener listener;
    int32_t block_size = 0;
    uint64_t seq = 0;
  };
  std::unordered_map<uint64_t, Subscriber> subscribers_;  // the delivery thread's
  std::thread thread_;
};

}  // namespace basalt

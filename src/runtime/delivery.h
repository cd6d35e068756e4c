// Delivery: hands each engine step's updates to their streams on a thread of
// its own, so that the scheduling thread never takes a stream's lock or runs
// a client's wake-up callback (an HTTP server's listener posts to its event
// loop on every token).
//
// Contract: post() takes a batch (streams of new requests, then updates in
// the order the scheduler made them) and returns at once; batches are
// delivered in post order, and within a batch in order, so every stream sees
// its updates in order and a new request's stream is known before its first
// update. A finished update is a stream's last: delivery forgets the stream
// after it. flush() waits until everything posted so far is delivered. The
// destructor delivers what is posted, then stops.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/request.h"
#include "runtime/request_stream.h"

namespace basalt {

class Delivery {
 public:
  struct Batch {
    std::vector<std::pair<uint64_t, RequestHandle>> streams;  // new requests
    std::vector<RequestUpdate> updates;
    bool empty() const { return streams.empty() && updates.empty(); }
  };

  Delivery();
  ~Delivery();
  Delivery(const Delivery&) = delete;
  Delivery& operator=(const Delivery&) = delete;

  void post(Batch batch);
  void flush();
  // Detaches the streams still open (their engine is going away).
  void detach_all();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;       // a batch or stop
  std::condition_variable idle_cv_;  // everything posted is delivered
  std::deque<Batch> queue_;
  uint64_t posted_ = 0;
  uint64_t delivered_ = 0;
  bool stop_ = false;
  std::unordered_map<uint64_t, RequestHandle> streams_;  // the delivery thread's
  std::thread thread_;
};

}  // namespace basalt

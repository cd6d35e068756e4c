#include "runtime/delivery.h"

#include <pthread.h>

namespace basalt {

Delivery::Delivery() : thread_([this] { loop(); }) {}

Delivery::~Delivery() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Delivery::post(Batch batch) {
  if (batch.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(batch));
    ++posted_;
  }
  cv_.notify_one();
}

std::vector<RequestUpdate> Delivery::spare_updates() {
  std::lock_guard<std::mutex> lock(mu_);
  if (spare_.empty()) return {};
  std::vector<RequestUpdate> v = std::move(spare_.back());
  spare_.pop_back();
  return v;
}

void Delivery::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = posted_;
  idle_cv_.wait(lock, [&] { return delivered_ >= target; });
}

void Delivery::detach_all() {
  // After the flush the delivery thread is idle, and nothing more is posted
  // (the engine's scheduling thread has stopped), so the map is ours.
  flush();
  for (auto& [id, stream] : streams_) stream->detach();
  streams_.clear();
}

void Delivery::deliver_kv_events(Batch& batch) {
  for (Subscription& s : batch.subscribe) {
    Subscriber& sub = subscribers_[s.id];
    sub.listener = std::move(s.listener);
    sub.block_size = s.block_size;
    KvEventBatch first;
    first.seq = ++sub.seq;
    first.snapshot = true;
    first.block_size = sub.block_size;
    first.events = std::move(s.snapshot);
    sub.listener(first);
  }
  if (!batch.kv_events.empty()) {
    for (auto& [id, sub] : subscribers_) {
      KvEventBatch b;
      b.seq = ++sub.seq;
      b.block_size = sub.block_size;
      b.events = batch.kv_events;
      sub.listener(b);
    }
  }
  for (uint64_t id : batch.unsubscribe) subscribers_.erase(id);
}

void Delivery::loop() {
  pthread_setname_np(pthread_self(), "basalt-deliver");
  for (;;) {
    Batch batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, with everything delivered
      batch = std::move(queue_.front());
      queue_.pop_front();
    }
    // The maps are this thread's alone (detach_all runs when it is idle).
    deliver_kv_events(batch);
    for (auto& [id, stream] : batch.streams) streams_.emplace(id, std::move(stream));
    for (RequestUpdate& u : batch.updates) {
      auto it = streams_.find(u.id);
      if (it == streams_.end()) continue;
      if (u.finished) {
        RequestHandle stream = std::move(it->second);
        streams_.erase(it);
        stream->push(std::move(u));
      } else {
        it->second->push(std::move(u));
      }
    }
    batch.updates.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (spare_.size() < kSpares && batch.updates.capacity() > 0) spare_.push_back(std::move(batch.updates));
      ++delivered_;
    }
    idle_cv_.notify_all();
  }
}

}  // namespace basalt

#include "router/admission.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace basalt::router {
namespace {

constexpr auto kRateWindow = std::chrono::seconds(10);

double seconds(AdmissionQueue::Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

std::optional<AdmissionDecision> AdmissionQueue::submit(AdmissionRequest request,
                                                        Clock::time_point now, Decided decided,
                                                        Id* id) {
  std::lock_guard<std::mutex> lock(mu_);
  TenantQueue& t = tenants_[request.tenant];
  // A reload may have changed the tenant: the latest request says.
  t.class_name = request.class_name;
  t.priority = request.priority;
  t.weight = request.weight > 0 ? request.weight : 1;
  t.max_concurrency = request.max_concurrency;
  virtual_time_.try_emplace(request.class_name, 0.0);
  if (request.max_queued > 0 && static_cast<int64_t>(t.fifo.size()) >= request.max_queued) {
    AdmissionDecision refused;
    refused.reason = "queue_full";
    refused.retry_after_s = retry_after(request.priority, request.queue_deadline, now);
    return refused;
  }
  const Id new_id = next_id_++;
  t.fifo.push_back(new_id);
  Entry e;
  e.request = std::move(request);
  e.request.cost = std::max<int64_t>(1, e.request.cost);
  e.decided = std::move(decided);
  e.enqueued = now;
  e.seq = new_id;
  entries_.emplace(new_id, std::move(e));
  if (id != nullptr) *id = new_id;
  return std::nullopt;
}

void AdmissionQueue::pump(Clock::time_point now) {
  std::lock_guard<std::mutex> pumping(pump_mu_);
  // Past their deadline: refused, with the class's estimated queue time.
  std::vector<std::pair<Decided, AdmissionDecision>> expired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      const Entry& e = it->second;
      if (now - e.enqueued < e.request.queue_deadline) {
        ++it;
        continue;
      }
      AdmissionDecision d;
      d.reason = "deadline";
      d.retry_after_s = retry_after(e.request.priority, e.request.queue_deadline, now);
      d.waited_s = seconds(now - e.enqueued);
      expired.emplace_back(e.decided, d);
      std::erase(tenants_[e.request.tenant].fifo, it->first);
      it = entries_.erase(it);
    }
  }
  for (auto& [decided, d] : expired)
    if (decided) decided(d);

  while (true) {
    Decided decided;
    AdmissionDecision d;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // The eligible heads, in dispatch order.
      struct Candidate {
        int priority;
        double start;
        uint64_t seq;
        TenantQueue* tenant;
      };
      std::vector<Candidate> order;
      for (auto& [name, t] : tenants_) {
        if (t.fifo.empty() || (t.max_concurrency > 0 && t.running >= t.max_concurrency)) continue;
        const Entry& head = entries_.at(t.fifo.front());
        order.push_back(
            {t.priority, std::max(virtual_time_[t.class_name], t.finish), head.seq, &t});
      }
      std::sort(order.begin(), order.end(), [](const Candidate& a, const Candidate& b) {
        return std::tie(b.priority, a.start, a.seq) < std::tie(a.priority, b.start, b.seq);
      });
      const Candidate* chosen = nullptr;
      for (const Candidate& c : order) {
        const Entry& head = entries_.at(c.tenant->fifo.front());
        if (!head.request.ready || head.request.ready()) {
          chosen = &c;
          break;
        }
      }
      if (chosen == nullptr) return;
      TenantQueue& t = *chosen->tenant;
      const Id id = t.fifo.front();
      t.fifo.pop_front();
      Entry e = std::move(entries_.at(id));
      entries_.erase(id);
      virtual_time_[t.class_name] = chosen->start;
      t.finish = chosen->start + static_cast<double>(e.request.cost) / t.weight;
      ++t.running;
      dispatched_.emplace_back(now, e.request.cost);
      d.dispatched = true;
      d.waited_s = seconds(now - e.enqueued);
      Waits& w = waits_[t.class_name];
      const auto bound =
          std::lower_bound(std::begin(kWaitBounds), std::end(kWaitBounds), d.waited_s);
      ++w.buckets[static_cast<size_t>(bound - std::begin(kWaitBounds))];
      ++w.count;
      w.sum += d.waited_s;
      decided = std::move(e.decided);
    }
    if (decided) decided(d);
  }
}

bool AdmissionQueue::cancel(Id id) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  std::erase(tenants_[it->second.request.tenant].fifo, id);
  entries_.erase(it);
  return true;
}

void AdmissionQueue::finished(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = tenants_.find(tenant);
  if (it != tenants_.end() && it->second.running > 0) --it->second.running;
}

size_t AdmissionQueue::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

std::map<std::pair<std::string, std::string>, int64_t> AdmissionQueue::depths() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::pair<std::string, std::string>, int64_t> out;
  for (const auto& [name, t] : tenants_)
    out[{t.class_name, name}] = static_cast<int64_t>(t.fifo.size());
  return out;
}

std::map<std::string, AdmissionQueue::Waits> AdmissionQueue::waits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waits_;
}

std::optional<double> AdmissionQueue::estimated_wait_s(int priority, Clock::time_point now) {
  while (!dispatched_.empty() && now - dispatched_.front().first > kRateWindow)
    dispatched_.pop_front();
  if (dispatched_.empty()) return std::nullopt;
  double tokens = 0;
  for (const auto& [when, cost] : dispatched_) tokens += static_cast<double>(cost);
  // Over the window, or since the first dispatch in it when that is
  // shorter (at least a second, so one burst does not read as a huge rate).
  const double span =
      std::max(1.0, std::min(seconds(kRateWindow), seconds(now - dispatched_.front().first)));
  const double rate = tokens / span;
  double ahead = 0;
  for (const auto& [id, e] : entries_)
    if (e.request.priority >= priority) ahead += static_cast<double>(e.request.cost);
  return ahead / rate;
}

int AdmissionQueue::retry_after(int priority, std::chrono::milliseconds deadline,
                                Clock::time_point now) {
  const double wait = estimated_wait_s(priority, now).value_or(seconds(deadline));
  return static_cast<int>(std::clamp(std::ceil(wait), 1.0, 60.0));
}

}  // namespace basalt::router

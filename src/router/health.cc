#include "router/health.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <map>
#include <mutex>
#include <set>

#include "server/http_client.h"

namespace basalt::router {

struct HealthChecker::Impl : std::enable_shared_from_this<Impl> {
  ReplicaRegistry& registry;
  boost::asio::io_context& io;
  HealthOptions options;
  boost::asio::steady_timer timer;
  std::mutex mu;  // what follows
  bool stopped = false;
  std::map<std::string, std::unique_ptr<HttpClient>> clients;  // per replica, for probes
  std::set<std::string> probing;                                // a probe is out
  std::vector<ExchangeHandle> out;

  Impl(ReplicaRegistry& r, boost::asio::io_context& i, HealthOptions o)
      : registry(r), io(i), options(o), timer(i) {}

  void tick() {
    const std::shared_ptr<const Snapshot> snapshot = registry.snapshot();
    std::lock_guard<std::mutex> lock(mu);
    if (stopped) return;
    out.clear();
    for (const Replica& r : snapshot->replicas) {
      if (!probing.insert(r.spec.id).second) continue;  // the last one is still out
      auto it = clients.find(r.spec.id);
      if (it == clients.end()) {
        HttpClientOptions o;
        o.timeout_s = std::chrono::duration<double>(options.timeout).count();
        o.max_body_bytes = 1 << 16;
        o.max_idle = 2;
        try {
          it = clients.emplace(r.spec.id, std::make_unique<HttpClient>(io, r.spec.url, o)).first;
        } catch (const std::exception&) {  // the host does not resolve: a failed probe
          probing.erase(r.spec.id);
          HealthChecker::record(*r.state, false, options, std::chrono::steady_clock::now());
          continue;
        }
      }
      OutgoingRequest req;
      req.path = "/ready";
      auto status = std::make_shared<int>(0);
      ExchangeCallbacks c;
      c.on_head = [status](const IncomingHead& h) { *status = h.status; };
      c.on_done = [weak = weak_from_this(), state = r.state, id = r.spec.id, status](HttpFailure f, const std::string&) {
        const auto self = weak.lock();
        if (!self) return;
        std::lock_guard<std::mutex> lock(self->mu);
        self->probing.erase(id);
        if (self->stopped || f == HttpFailure::kCancelled) return;
        HealthChecker::record(*state, f == HttpFailure::kNone && *status == 200, self->options,
                              std::chrono::steady_clock::now());
      };
      out.push_back(it->second->send(req, std::move(c)));
    }
    timer.expires_after(options.interval);
    timer.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      if (ec) return;
      if (const auto self = weak.lock()) self->tick();
    });
  }
};

HealthChecker::HealthChecker(ReplicaRegistry& registry, boost::asio::io_context& io, HealthOptions options)
    : impl_(std::make_shared<Impl>(registry, io, options)) {}

HealthChecker::~HealthChecker() { stop(); }

void HealthChecker::start() {
  boost::asio::post(impl_->io, [impl = impl_] { impl->tick(); });
}

void HealthChecker::stop() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->timer.cancel();  // the timer is only touched under mu
  for (const ExchangeHandle& h : impl_->out) h.cancel();
}

void HealthChecker::record(ReplicaState& state, bool ok, const HealthOptions& options,
                           std::chrono::steady_clock::time_point now) {
  std::lock_guard<std::mutex> lock(state.mu);
  if (ok) {
    state.probe_failures = 0;
    if (++state.probe_successes >= options.successes_to_healthy) state.healthy.store(true);
    state.breaker.probe_succeeded(now);
  } else {
    state.probe_successes = 0;
    if (++state.probe_failures >= options.failures_to_unhealthy) state.healthy.store(false);
  }
}

}  // namespace basalt::router

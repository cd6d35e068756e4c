#include "router/replica_poller.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "server/http_client.h"

namespace basalt::router {

struct ReplicaPoller::Impl : std::enable_shared_from_this<Impl> {
  ReplicaRegistry& registry;
  boost::asio::io_context& io;
  PollOptions options;
  OnAnswer on_answer;
  boost::asio::steady_timer timer;
  std::mutex mu;  // what follows
  bool stopped = false;
  std::map<std::string, std::unique_ptr<HttpClient>> clients;  // per replica
  std::set<std::string> asking;                                 // a request is out
  std::vector<ExchangeHandle> out;

  Impl(ReplicaRegistry& r, boost::asio::io_context& i, PollOptions o, OnAnswer a)
      : registry(r), io(i), options(std::move(o)), on_answer(std::move(a)), timer(i) {}

  void round() {
    const std::shared_ptr<const Snapshot> snapshot = registry.snapshot();
    std::vector<std::shared_ptr<ReplicaState>> unresolved;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopped) return;
      out.clear();
      for (const Replica& r : snapshot->replicas) {
        if (!asking.insert(r.spec.id).second) continue;  // the last one is still out
        auto it = clients.find(r.spec.id);
        if (it == clients.end()) {
          HttpClientOptions o;
          o.timeout_s = std::chrono::duration<double>(options.timeout).count();
          o.max_body_bytes = options.max_body_bytes;
          o.max_idle = 2;
          try {
            it = clients.emplace(r.spec.id, std::make_unique<HttpClient>(io, r.spec.url, o)).first;
          } catch (const std::exception&) {  // the host does not resolve
            asking.erase(r.spec.id);
            unresolved.push_back(r.state);
            continue;
          }
        }
        out.push_back(it->second->send(request(), callbacks(r)));
      }
      timer.expires_after(options.interval);
      timer.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
        if (ec) return;
        if (const auto self = weak.lock()) self->round();
      });
    }
    for (const std::shared_ptr<ReplicaState>& state : unresolved) on_answer(*state, std::nullopt);
  }

  OutgoingRequest request() const {
    OutgoingRequest req;
    req.path = options.path;
    return req;
  }

  ExchangeCallbacks callbacks(const Replica& r) {
    auto answer = std::make_shared<PollAnswer>();
    ExchangeCallbacks c;
    c.on_head = [answer](const IncomingHead& h) { answer->status = h.status; };
    c.on_data = [answer](std::string_view bytes) { answer->body.append(bytes); };
    c.on_done = [weak = weak_from_this(), state = r.state, id = r.spec.id, answer](HttpFailure f,
                                                                                     const std::string&) {
      const auto self = weak.lock();
      if (!self) return;
      {
        std::lock_guard<std::mutex> lock(self->mu);
        self->asking.erase(id);
        if (self->stopped || f == HttpFailure::kCancelled) return;
      }
      if (f == HttpFailure::kNone)
        self->on_answer(*state, std::move(*answer));
      else
        self->on_answer(*state, std::nullopt);
    };
    return c;
  }
};

ReplicaPoller::ReplicaPoller(ReplicaRegistry& registry, boost::asio::io_context& io, PollOptions options,
                             OnAnswer on_answer)
    : impl_(std::make_shared<Impl>(registry, io, std::move(options), std::move(on_answer))) {}

ReplicaPoller::~ReplicaPoller() { stop(); }

void ReplicaPoller::start() {
  boost::asio::post(impl_->io, [impl = impl_] { impl->round(); });
}

void ReplicaPoller::stop() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->timer.cancel();  // the timer is only touched under mu
  for (const ExchangeHandle& h : impl_->out) h.cancel();
}

}  // namespace basalt::router

#include "router/kv_events_subscriber.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <charconv>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "server/http_client.h"
#include "server/sse.h"

namespace basalt::router {

std::optional<KvBatch> parse_kv_batch(std::string_view data) {
  const nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  const auto seq = j.find("seq");
  const auto snapshot = j.find("snapshot");
  const auto block_size = j.find("block_size");
  const auto events = j.find("events");
  if (seq == j.end() || !seq->is_number_unsigned() || snapshot == j.end() || !snapshot->is_boolean() ||
      block_size == j.end() || !block_size->is_number_unsigned() || events == j.end() || !events->is_array())
    return std::nullopt;
  KvBatch b;
  b.seq = seq->get<uint64_t>();
  b.snapshot = snapshot->get<bool>();
  const uint64_t size = block_size->get<uint64_t>();
  if (size == 0 || size > (1u << 20)) return std::nullopt;
  b.block_size = static_cast<int32_t>(size);
  for (const nlohmann::json& e : *events) {
    if (!e.is_object()) return std::nullopt;
    const auto type = e.find("type");
    const auto hashes = e.find("block_hashes");
    if (type == e.end() || !type->is_string() || hashes == e.end() || !hashes->is_array()) return std::nullopt;
    KvBatch::Event out;
    if (*type == "stored") {
      out.stored = true;
    } else if (*type != "removed") {
      return std::nullopt;
    }
    out.hashes.reserve(hashes->size());
    for (const nlohmann::json& h : *hashes) {
      if (!h.is_string()) return std::nullopt;
      const std::string& hex = h.get_ref<const std::string&>();
      uint64_t v = 0;
      const auto [end, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), v, 16);
      if (hex.size() != 16 || ec != std::errc() || end != hex.data() + hex.size()) return std::nullopt;
      out.hashes.push_back(v);
    }
    b.events.push_back(std::move(out));
  }
  return b;
}

namespace {

// One replica's stream: its client, the exchange, and where it stands.
struct Stream {
  std::unique_ptr<HttpClient> client;
  ExchangeHandle exchange;
  bool open = false;   // an exchange is out
  bool live = false;   // its snapshot arrived
  uint64_t next_seq = 1;
  std::chrono::steady_clock::time_point retry_after{};  // after a 404
  uint64_t generation = 0;  // which exchange the callbacks belong to
};

}  // namespace

struct KvEventSubscriber::Impl : std::enable_shared_from_this<Impl> {
  ReplicaRegistry& registry;
  boost::asio::io_context& io;
  KvIndex& index;
  KvEventsOptions options;
  boost::asio::steady_timer timer;
  mutable std::mutex mu;  // what follows
  bool stopped = false;
  std::map<std::string, Stream> streams;
  std::map<std::string, uint64_t> resyncs;

  Impl(ReplicaRegistry& r, boost::asio::io_context& i, KvIndex& x, KvEventsOptions o)
      : registry(r), io(i), index(x), options(std::move(o)), timer(i) {}

  void round() {
    const std::shared_ptr<const Snapshot> snapshot = registry.snapshot();
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(mu);
    if (stopped) return;
    // Replicas no longer listed, or draining: their streams go.
    for (auto it = streams.begin(); it != streams.end();) {
      const Replica* r = snapshot->find(it->first);
      if (r != nullptr && !r->state->draining.load()) {
        ++it;
        continue;
      }
      it->second.exchange.cancel();
      index.drop(it->first);
      it = streams.erase(it);
    }
    for (const Replica& r : snapshot->replicas) {
      if (r.state->draining.load()) continue;
      Stream& s = streams[r.spec.id];
      if (s.open || now < s.retry_after) continue;
      if (!s.client) {
        HttpClientOptions o;
        o.timeout_s = 9e6;  // a stream lasts as long as the replica; renewed after about 100 days
        o.max_body_bytes = std::numeric_limits<size_t>::max();
        o.max_idle = 1;
        try {
          s.client = std::make_unique<HttpClient>(io, r.spec.url, o);
        } catch (const std::exception&) {
          continue;  // the host does not resolve: the next round tries again
        }
      }
      OutgoingRequest req;
      req.path = "/v1/kv_events";
      req.headers.emplace_back("Accept", "text/event-stream");
      if (!options.api_key.empty()) req.headers.emplace_back("Authorization", "Bearer " + options.api_key);
      s.open = true;
      s.live = false;
      s.next_seq = 1;
      s.exchange = s.client->send(std::move(req), callbacks(r.spec.id, ++s.generation));
    }
    timer.expires_after(options.interval);
    timer.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      if (ec) return;
      if (const auto self = weak.lock()) self->round();
    });
  }

  // The stream of `id` ends (under mu): its entries go; a live one was a resync.
  void end_locked(const std::string& id, Stream& s, bool cancel) {
    if (cancel) s.exchange.cancel();
    if (s.live) ++resyncs[id];
    s.open = false;
    s.live = false;
    index.drop(id);
  }

  ExchangeCallbacks callbacks(const std::string& id, uint64_t generation) {
    struct Reader {
      std::unique_ptr<SseParser> sse;
      bool failed = false;
    };
    auto reader = std::make_shared<Reader>();
    const std::weak_ptr<Impl> weak = weak_from_this();
    // One event's data: a batch, applied under mu in order. The parser is
    // the reader's, so it refers to it plainly: a shared_ptr here would be
    // a cycle that never frees either.
    reader->sse = std::make_unique<SseParser>(
        [weak, id, generation, reader = reader.get()](std::string_view data) {
          const auto self = weak.lock();
          if (!self || reader->failed) return;
          const std::optional<KvBatch> batch = parse_kv_batch(data);
          std::lock_guard<std::mutex> lock(self->mu);
          const auto it = self->streams.find(id);
          if (it == self->streams.end() || it->second.generation != generation || !it->second.open) return;
          Stream& s = it->second;
          const bool in_order = batch && batch->seq == s.next_seq && batch->snapshot == (s.next_seq == 1);
          if (!in_order) {
            reader->failed = true;
            LogLine("kv_events", LogLevel::kWarning)
                .add("replica", id)
                .add("event", batch ? "gap" : "unexpected")
                .emit();
            self->end_locked(id, s, /*cancel=*/true);
            return;
          }
          if (batch->snapshot) {
            self->index.reset(id, batch->block_size);
            s.live = true;
          }
          ++s.next_seq;
          for (const KvBatch::Event& e : batch->events) {
            if (!e.stored) {
              self->index.removed(id, e.hashes);
            } else if (!self->index.stored(id, e.hashes)) {
              reader->failed = true;
              LogLine("kv_events", LogLevel::kWarning).add("replica", id).add("event", "too_many_blocks").emit();
              self->end_locked(id, s, /*cancel=*/true);
              return;
            }
          }
        },
        options.max_event_bytes);
    ExchangeCallbacks c;
    c.on_head = [weak, id, generation, reader](const IncomingHead& h) {
      if (h.status == 200) return;
      reader->failed = true;
      const auto self = weak.lock();
      if (!self) return;
      std::lock_guard<std::mutex> lock(self->mu);
      const auto it = self->streams.find(id);
      if (it == self->streams.end() || it->second.generation != generation) return;
      // A replica without KV events is asked again much later.
      if (h.status == 404) it->second.retry_after = std::chrono::steady_clock::now() + self->options.absent_retry;
      LogLine("kv_events", LogLevel::kInfo).add("replica", id).add("status", h.status).emit();
      self->end_locked(id, it->second, /*cancel=*/true);
    };
    c.on_data = [weak, id, generation, reader](std::string_view bytes) {
      if (reader->failed || reader->sse->feed(bytes)) return;
      reader->failed = true;  // a line past max_event_bytes
      const auto self = weak.lock();
      if (!self) return;
      std::lock_guard<std::mutex> lock(self->mu);
      const auto it = self->streams.find(id);
      if (it == self->streams.end() || it->second.generation != generation || !it->second.open) return;
      LogLine("kv_events", LogLevel::kWarning).add("replica", id).add("event", "oversized").emit();
      self->end_locked(id, it->second, /*cancel=*/true);
    };
    c.on_done = [weak, id, generation](HttpFailure, const std::string&) {
      const auto self = weak.lock();
      if (!self) return;
      std::lock_guard<std::mutex> lock(self->mu);
      const auto it = self->streams.find(id);
      if (it == self->streams.end() || it->second.generation != generation || !it->second.open) return;
      self->end_locked(id, it->second, /*cancel=*/false);
    };
    return c;
  }
};

KvEventSubscriber::KvEventSubscriber(ReplicaRegistry& registry, boost::asio::io_context& io, KvIndex& index,
                                     KvEventsOptions options)
    : impl_(std::make_shared<Impl>(registry, io, index, std::move(options))) {}

KvEventSubscriber::~KvEventSubscriber() { stop(); }

void KvEventSubscriber::start() {
  boost::asio::post(impl_->io, [impl = impl_] { impl->round(); });
}

void KvEventSubscriber::stop() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->timer.cancel();
  for (auto& [id, s] : impl_->streams) {
    s.exchange.cancel();
    impl_->index.drop(id);
  }
}

std::map<std::string, uint64_t> KvEventSubscriber::resyncs() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->resyncs;
}

}  // namespace basalt::router

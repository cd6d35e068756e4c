// KvEventSubscriber: one GET /v1/kv_events stream open to each listed
// replica, read into a KvIndex (docs/ROUTER.md §2, step 12; the stream's
// format is docs/SERVER.md's "KV events").
//
// Contract: runs on the io_context it is given. Every `interval` a round
// opens a stream to each listed, non-draining replica that has none and
// cancels the streams of replicas no longer listed (their entries are
// dropped). A replica that answers 404 (no KV events: not a Basalt
// replica, or an older one) is asked again only after `absent_retry`.
// A stream's first batch must be seq 1 and a snapshot, which becomes the
// replica's entries (it is live from then); each later batch must carry
// the next seq. Anything else (a gap, a batch that does not parse, an
// error event, a status other than 200, a line past max_event_bytes, the
// stream's end) drops the replica's entries and ends its stream; the next
// round subscribes again, and a stream that had gone live counts as a
// resync. start() and stop() from any thread; stop() (also the destructor)
// cancels the streams.
//
// parse_kv_batch reads one event's data: nullopt unless it is an object
// with an unsigned seq, a boolean snapshot, a positive block_size and an
// events array whose items are "stored" or "removed" with block_hashes of
// 16 hex digits each (other fields are not needed by the gateway).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "router/kv_index.h"
#include "router/replica_registry.h"

namespace boost::asio {
class io_context;
}

namespace basalt::router {

struct KvBatch {
  uint64_t seq = 0;
  bool snapshot = false;
  int32_t block_size = 0;
  struct Event {
    bool stored = false;  // else removed
    std::vector<uint64_t> hashes;
  };
  std::vector<Event> events;  // in order: a block stored then removed ends removed
};
std::optional<KvBatch> parse_kv_batch(std::string_view data);

struct KvEventsOptions {
  std::chrono::milliseconds interval{1000};
  std::chrono::milliseconds absent_retry{30000};
  std::string api_key;  // sent as a Bearer token when set
  size_t max_event_bytes = size_t{64} << 20;
};

class KvEventSubscriber {
 public:
  KvEventSubscriber(ReplicaRegistry& registry, boost::asio::io_context& io, KvIndex& index,
                    KvEventsOptions options);
  ~KvEventSubscriber();
  KvEventSubscriber(const KvEventSubscriber&) = delete;
  KvEventSubscriber& operator=(const KvEventSubscriber&) = delete;
  void start();
  void stop();
  // Per replica ever subscribed: the streams that went live and later ended.
  std::map<std::string, uint64_t> resyncs() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace basalt::router

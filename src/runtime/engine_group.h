// EngineGroup: the engines of one model's DP-attention ranks
// (model/data_parallel.h), each with its own scheduler, radix cache and KV,
// behind one EngineClient, so the server and the CLI see one engine.
//
// Contract:
//  * submit() sends a request to the engine whose radix cache holds the
//    longest prefix of its prompt, in whole KV-event blocks (each engine's
//    blocks are kept from its KV events), among the engines not much busier
//    than the least busy one (Engine::load() within max(2, least / 4) of
//    it); ties go to the less busy, then to the engines in turn. So a
//    conversation's next turn finds its prefix, and a popular prefix does not
//    pull every request onto one rank (SGLang's DP controller sends requests
//    round-robin; its router balances the same two signals across
//    replicas). submit_n() sends all n samples of a prompt to one engine,
//    so they share its cached prompt. cancel(id) is passed to every engine
//    (request ids are unique in the process; the engines that do not hold
//    it ignore it).
//  * metrics() is the engines' metrics added up (EngineMetrics::merge);
//    kv_capacity() the sum of theirs; model_config() the first engine's.
//  * KV events: one subscription per engine, merged into one numbered
//    stream whose first batch is the snapshot (the other engines' snapshots
//    follow as stores). A block's removal is passed on only once no engine
//    holds it any more, so a subscriber's view is the union of the ranks'
//    caches.
//  * The group owns its engines; they stop when it is destroyed.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "runtime/engine.h"

namespace basalt {

class EngineGroup final : public EngineClient {
 public:
  explicit EngineGroup(std::vector<std::unique_ptr<Engine>> engines);
  ~EngineGroup() override;

  RequestHandle submit(EngineRequest request) override;
  std::vector<RequestHandle> submit_n(EngineRequest request, int n) override;
  void cancel(uint64_t id) override;
  EngineMetrics metrics() const override;
  int64_t kv_capacity() const override;
  const ModelConfig& model_config() const override;
  uint64_t subscribe_kv_events(KvEventListener listener) override;
  void unsubscribe_kv_events(uint64_t id) override;

  int size() const { return static_cast<int>(engines_.size()); }
  Engine& engine(int i) { return *engines_[static_cast<size_t>(i)]; }
  // Leading blocks of `prompt` (in namespace ns) engine i holds, as its KV
  // events have told so far.
  size_t cached_prefix_blocks(int i, uint64_t ns, std::span<const int32_t> prompt) const;

 private:
  struct Subscription;
  struct CachedBlocks;
  // A prompt's block hashes at one block size.
  struct PromptBlocks {
    int32_t block_size = 0;
    std::vector<uint64_t> hashes;
  };
  Engine& pick(const EngineRequest& request);
  // cached_prefix_blocks, hashing the prompt into `blocks` only when its
  // block size differs from engine i's.
  size_t leading_blocks(int i, uint64_t ns, std::span<const int32_t> prompt, PromptBlocks& blocks) const;

  std::vector<std::unique_ptr<Engine>> engines_;
  std::vector<std::unique_ptr<CachedBlocks>> cached_;  // per engine
  std::atomic<uint64_t> turn_{0};
  std::mutex mu_;  // subscriptions_, next_subscription_
  std::vector<std::shared_ptr<Subscription>> subscriptions_;
  uint64_t next_subscription_ = 1;
};

}  // namespace basalt

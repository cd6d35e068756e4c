// Model: a loaded checkpoint that runs forward steps on a backend.
//
// Contract: load_model(dir, backend) reads config.json and the safetensors
// weights, checks every tensor's presence, dtype and shape against the
// config (errors name the file and tensor), checks that the config used every
// tensor of the checkpoint (but those transformers also skips: rotary
// buffers, a tied head, extra MTP layers), and moves the weights to the
// backend. The files are read into the page cache on a second thread
// meanwhile (Checkpoint::prefetch, reporting `progress`), so reading and
// moving overlap: for a dense model (of a group's ranks, those given
// `progress`) and a DeepSeek model on a GPU alone; a DeepSeek model on the
// CPU maps its weights, and only the pages a forward pass uses are read.
// forward() runs one ForwardBatch: it writes the new tokens' keys and
// values into `kv` at batch.out_slots and returns f32 logits for
// batch.logit_rows, and, when `hidden` is given, the final hidden state of
// every batch token (after the final norm: what lm_head reads, and what draft
// heads take). draft_head() is the checkpoint's own draft model (DeepSeek's
// MTP layer), or null. A Model is used by one thread at a time; it holds no
// per-request state (that lives in the KV slots the caller manages).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/draft_head.h"
#include "model/forward_batch.h"

namespace basalt {

// The per-layer KV storage that slots index into. Dense models: layer l's
// keys are k[l][slot, :] ([num_slots, kv_heads * head_dim]) and values
// v[l][slot, :]. MLA models (DeepSeek): k[l] is the latent cache
// [num_slots, kv_lora_rank + qk_rope_head_dim] (the normalized latent, then
// the rotated rope key) and v[l] is empty.
struct KvBuffers {
  std::vector<Tensor> k;
  std::vector<Tensor> v;
  int64_t num_slots = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  // Allocates KV storage for num_slots token slots on the model's backend.
  virtual KvBuffers allocate_kv(int64_t num_slots, DType dtype = DType::kF32) const = 0;
  // Bytes of KV storage one token slot takes across all layers.
  virtual size_t kv_bytes_per_slot(DType dtype) const = 0;
  // logits: f32 [batch.logit_rows.numel(), vocab_size]; hidden (optional):
  // f32 [batch.num_tokens(), hidden_size]; both allocated by the caller.
  virtual void forward(const ForwardBatch& batch, KvBuffers& kv, Tensor& logits, Tensor* hidden) = 0;
  void forward(const ForwardBatch& batch, KvBuffers& kv, Tensor& logits) { forward(batch, kv, logits, nullptr); }
  // The checkpoint's draft model, if it has one (it lives as long as the model).
  virtual DraftHead* draft_head() { return nullptr; }
  // Called by a serving engine once its KV storage exists, before its first
  // step: a model may do one-time work against that storage here (a
  // GraphedModel records its decode graphs). The default does nothing.
  virtual void prepare(KvBuffers& kv) { (void)kv; }
  // A human-readable account of what was loaded (parameters, dtypes, experts),
  // printed on start; empty when the model has nothing to add.
  virtual std::string summary() const { return {}; }
  // Whether forward() takes batch.token_ids in its backend's memory (the
  // other inputs on the host): a runner then moves drafts that are still on
  // the device into a step's ids without waiting for them.
  virtual bool takes_device_token_ids() const { return false; }
};

// progress(done_bytes, total_bytes) is called while weights are read.
using LoadProgress = std::function<void(uint64_t, uint64_t)>;

// The part one rank plays in a model split over a group of ranks. With no
// group the rank holds the whole model. With a group and no dp_attention
// the model is tensor-parallel over it (model/dense.h, model/deepseek_v3.h
// say what a rank holds); with dp_attention (DeepSeek only) each rank runs
// the whole model but the routed experts on a batch of its own, the experts
// split over the group (model/data_parallel.h).
// dp_moe chooses how DP attention's tokens reach the routed experts
// (model/deepseek_v3.h): kExchange sends each (token, choice) pair to its
// expert's rank and back (all-to-all, sized on the host per layer); kGather
// all-gathers every rank's hidden rows (padded to the step's largest batch),
// each rank routes them all and runs its own experts, and a reduce-scatter
// sums the ranks' parts into each rank's own rows (SGLang's DP attention
// without DeepEP): fixed sizes per step, no host read per layer.
// dense_tp (DP attention by kGather only): the dense layers' MLPs and the
// shared experts are split over the group as under tensor parallelism
// instead of held whole by every rank (SGLang's default; its
// --moe-dense-tp-size 1 replicates them). Each rank runs its slice on the
// gathered rows of every rank, and the same reduce-scatter sums them: a
// shared expert costs no collective of its own, a dense layer one gather
// and one reduce-scatter, and a rank holds and reads 1/N of those weights.
// attention (DP attention only; null: none): the ranks that share this
// rank's batch, its DP group, over which the attention heads, the
// vocabulary and (without dense_tp) the dense and shared MLPs are split as
// under tensor parallelism (SGLang's --dp smaller than --tp: attention TP
// of tp/dp ranks inside each DP group); `group` is then every rank of every
// DP group, over which the routed experts are split. Each rank of a DP
// group sends only its share of the group's rows to the experts (rows
// [a*S, (a+1)*S) of the group's T, S = ceil(T / A), for its place a of the
// A), and the feed-forward's all-reduce over `attention` puts the shares
// back together, so no expert computes a row twice.
class Communicator;
enum class DpMoe : uint8_t { kExchange, kGather };
struct RankRole {
  Communicator* group = nullptr;
  bool dp_attention = false;
  DpMoe dp_moe = DpMoe::kExchange;
  bool dense_tp = false;
  Communicator* attention = nullptr;
};
// Where the weights come from: the checkpoint's files, or random values in
// the config's shapes (Checkpoint::random: benchmarks at full shape without
// a download; only config.json is read from `dir`).
enum class Weights : uint8_t { kCheckpoint, kRandom };
std::unique_ptr<Model> load_model(const std::string& dir, Backend& backend,
                                  const LoadProgress& progress = {}, const RankRole& role = {},
                                  Weights weights = Weights::kCheckpoint);

}  // namespace basalt

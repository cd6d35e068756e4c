// A model over N tensor-parallel ranks that run as threads of this process,
// seen by the engine as one Model.
//
// Contract: load_tensor_parallel(dir, world, make_backend) makes a backend
// per rank (make_backend(rank): each its own, e.g. a CPU backend with its
// own share of the cores, or the GPU of that rank; with `first` given, rank
// 0 runs on that backend, the caller's, which it does not own), the
// communicator group (make_group(backends): NCCL across GPUs; by default
// the in-process group, which stages device tensors through host memory so
// that ranks may share one GPU in tests), one thread per rank, and loads
// every rank's shard on its thread (model/dense.h and model/deepseek_v3.cc's
// plan_shards say what a rank holds; a config that does not divide is
// refused). forward() hands the batch to every rank, waits for all of them
// and leaves rank 0's logits and hidden states in the caller's tensors,
// which live on rank 0's device (on a GPU, written in rank 0's stream: give
// the caller's backend as `first`, so that its later work follows them); an
// error on any rank is rethrown to the caller (with the same batch on every
// rank, a bad batch fails on all of them before their first collective, and
// the caller's output tensors, which only rank 0 sees, are checked before
// any rank starts). allocate_kv() gives each rank KV for its own heads on
// its device, laid out in one KvBuffers: layer l of rank r is k[r *
// num_layers + l] (and v likewise); kv_bytes_per_slot() is the sum over
// ranks, replicated key/value heads counted on every rank that holds them.
// Like any Model, one thread at a time calls it. With `graphs` given, and
// where every rank's backend and communicator can record (GPU ranks over
// NCCL), each rank's model is a GraphedModel of its own whose recordings
// hold its collectives; prepare() records every rank's decode sizes (all
// ranks take the same path for a batch, so their collectives stay in
// step), and the caller must not wrap the whole in another GraphedModel.
// Otherwise the ranks run eagerly. Its draft_head() is the ranks' heads
// run as one (DeepSeek's MTP layer, each rank its shard; null when the
// ranks' models have none):
// each pass broadcasts the caller's hidden states from rank 0, and its KV
// is laid out as the model's (the head's layers of rank r after rank r-1's).
// An EAGLE head or a draft model can be attached beside the whole instead.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/graphed_model.h"
#include "model/model.h"

namespace basalt {

using RankBackendFactory = std::function<std::unique_ptr<Backend>(int rank)>;
using RankGroupFactory = std::function<std::vector<std::unique_ptr<Communicator>>(std::span<Backend* const>)>;

std::unique_ptr<Model> load_tensor_parallel(const std::string& dir, int world, const RankBackendFactory& make_backend,
                                            const LoadProgress& progress = {}, Backend* first = nullptr,
                                            const RankGroupFactory& make_group = {},
                                            Weights weights = Weights::kCheckpoint,
                                            const std::optional<GraphOptions>& graphs = std::nullopt);

// The checks forward() and draft_head()->forward() make before any rank
// starts, on their own (model/multi_node.h makes them before it tells the
// other machines' ranks to start): they throw what those would.
void check_tensor_parallel_forward(const Model& model, const ForwardBatch& batch, const KvBuffers& kv,
                                   const Tensor& logits, const Tensor* hidden);
void check_tensor_parallel_head_forward(Model& model, const ForwardBatch& batch, const Tensor& hidden,
                                        const KvBuffers& kv, const Tensor& logits, const Tensor* hidden_out);

// Whether `model` (made by load_tensor_parallel) runs graphs per rank.
bool tensor_parallel_graphed(const Model& model);
// Rank `rank`'s graph counters (zeros when it runs eagerly).
GraphStats tensor_parallel_graph_stats(const Model& model, int rank);

}  // namespace basalt

// A model over N tensor-parallel ranks that run as threads of this process,
// seen by the engine as one Model.
//
// Contract: load_tensor_parallel(dir, world, make_backend) makes the
// in-process communicator group (backend/communicator.h), a backend per
// rank (make_backend(rank): each its own, e.g. a CPU backend with its own
// share of the cores), one thread per rank, and loads every rank's shard on
// its thread (model/dense.h and model/deepseek_v3.cc's plan_shards say what
// a rank holds; a config that does not divide is refused). forward() hands the
// batch to every rank, waits for all of them and leaves rank 0's logits and
// hidden states in the caller's tensors; an error on any rank is rethrown
// to the caller (with the same batch on every rank, a bad batch fails on
// all of them before their first collective, and the caller's output
// tensors, which only rank 0 sees, are checked before any rank starts). allocate_kv() gives each rank
// KV for its own heads, laid out in one KvBuffers: layer l of rank r is
// k[r * num_layers + l] (and v likewise); kv_bytes_per_slot() is the sum over
// ranks, replicated key/value heads counted on every rank that holds them.
// The ranks' backends keep their memory on the host for now (the CPU
// backend), so the caller's tensors are host tensors. Like any Model, one
// thread at a time calls it. It has no draft head of its own: DeepSeek's
// MTP layer is not offered over ranks yet (an EAGLE head or a draft model
// can still be attached beside the whole).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "model/model.h"

namespace basalt {

using RankBackendFactory = std::function<std::unique_ptr<Backend>(int rank)>;

std::unique_ptr<Model> load_tensor_parallel(const std::string& dir, int world, const RankBackendFactory& make_backend,
                                            const LoadProgress& progress = {});

}  // namespace basalt

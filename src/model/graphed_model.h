// GraphedModel: a Model whose decode steps replay recorded graphs.
//
// A decode step of a 32-layer model is a few hundred short kernels; launched
// one by one from the host, their launch cost is a large part of the step at
// small batch. This wrapper records the wrapped model's forward once per
// padded batch size (Backend::record: CUDA graphs) and replays it.
//
// Contract:
//  * forward() takes the recorded path for a batch on the host whose every
//    sequence has the same number R of new tokens, 1 (decode) to 8 (a
//    speculative verification: the last token and its drafts), q_start =
//    0, R, 2R, ..., T, the logits of every row wanted in order (logit_rows
//    = 0..T-1), T <= max_batch once padded, and kv_slots that fit the static
//    buffer; with or without the final hidden states (a draft head reads
//    them). The token ids may be on the device instead (copied into the
//    static inputs there). Any other batch (prefill, extend, drafts of
//    different lengths, other device tensors) runs the wrapped model
//    directly.
//  * draft_head() is the wrapped model's draft head (null when it has none),
//    wrapped the same way: a head step takes the recorded path under the
//    same conditions except that it may want one logits row per sequence,
//    anywhere in that sequence (the row that drafts the next token),
//    instead of every row, and its `hidden` input (device memory) is copied
//    into a static buffer first. Its graphs are bound to the head's own
//    KvBuffers.
//  * A recorded batch is padded to the next recorded count of sequences (1,
//    2, 4, 8, then multiples of 8) with sequences of R query rows and no
//    keys whose tokens write no KV (slot -1); Backend::store_kv and
//    attention define that case (nothing stored, zero output), and their
//    logits are dropped. Graphs are kept per (sequences, R, hidden states
//    or not, every row's logits or one per sequence). The result is what
//    the wrapped model computes for the padded batch, which for a backend
//    that is not batch invariant may differ in rounding from the unpadded
//    batch.
//  * prepare(kv) (the engine calls it before its first step) records every
//    decode size (R = 1) up to max_batch on batches of padding rows only; a
//    shape still missing (any R > 1, hidden states, any head step) is
//    recorded the first time a batch needs it (unless
//    GraphOptions::record_on_demand is false: then it runs directly). Each
//    recording follows one direct run of its batch (which loads kernels and
//    plans outside the recording) and is bound to the KvBuffers passed: a
//    forward with other KvBuffers (other memory) drops every graph of that
//    model or head and records again. On a backend that cannot record
//    (Backend::can_record false: the CPU's) every batch runs directly and
//    prepare() does nothing.
//  * Memory kept: the static inputs (7 i32 arrays sized by max_batch, plus
//    kv_capacity slots), logits [max_batch, vocab] f32, hidden states
//    [max_batch, hidden_size] f32 once a step keeps them, and the scratch of
//    the recordings (shared by all of them); a draft head has its own static
//    inputs, logits and two hidden-state buffers (in and out).
//  * Used by one thread at a time, like any Model.
#pragma once

#include <memory>

#include "model/model.h"

namespace basalt {

struct GraphOptions {
  int max_batch = 256;
  // Most KV entries (the sum of every sequence's keys) a recorded step may
  // read; 0 means twice the KvBuffers' slot count.
  int64_t kv_capacity = 0;
  // False: nothing records but prepare(), which records every decode size
  // afresh (on the same KvBuffers too); a batch whose shape it did not
  // record (or that meets other KvBuffers) runs the wrapped model directly.
  // For ranks whose steps hold collectives (model/data_parallel.h), where a
  // recording (a direct run, the recording, a replay) must happen on every
  // rank at once or on none.
  bool record_on_demand = true;
};

// The count of sequences a recorded batch of `sequences` is padded to: 1,
// 2, 4, 5, 8, then the next multiple of 8 (at most max_batch).
int graph_padded_size(int64_t sequences, int max_batch);

std::unique_ptr<Model> make_graphed_model(std::unique_ptr<Model> model, Backend& backend,
                                          const GraphOptions& options = {});

// Counters for tests and logs.
struct GraphStats {
  int64_t replays = 0;     // steps that took the recorded path
  int64_t direct = 0;      // steps that ran the wrapped model directly
  int64_t recordings = 0;  // graphs recorded
  // The same for the draft head's steps (zeros without a head).
  int64_t head_replays = 0, head_direct = 0, head_recordings = 0;
};
// The counters of a model made by make_graphed_model (zeros for any other).
GraphStats graph_stats(const Model& model);

}  // namespace basalt

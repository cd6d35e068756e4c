// What the tensor-parallel layouts of the models (model/dense.h,
// model/deepseek_v3.h) share: column slices of host weights, and the
// vocabulary-parallel embedding and lm_head.
//
// Contract: a rank of N holds vocabulary rows [begin, begin + count) of the
// embedding as vocab_shard(): those rows, then one row of zeros. Its
// forward maps the batch's ids with local_vocab_ids() (an id of its rows to
// its row, any other to the zero row), looks them up, and the all-reduce
// of the ranks' lookups is the embedding. Its lm_head is the same rows (or
// lm_head's), giving logits for its columns; gather_vocab_columns() puts
// the ranks' columns side by side on every rank, on the rank's backend
// (part and logits live there). The weight helpers take host tensors (they
// slice before upload); the checks throw basalt::Error.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "core/tensor.h"

namespace basalt {

class Communicator;

namespace tp {

// Throws unless `value` (the config field `field`) divides by `world`.
void check_divides(int64_t world, int64_t value, const char* field);
// Columns [begin, begin + count) of a 2-D host tensor, copied.
Tensor columns(const Tensor& t, int64_t begin, int64_t count);
// Rows [begin, begin + count) of a 2-D host table, then a row of zeros.
Tensor vocab_shard(const Tensor& table, int64_t begin, int64_t count);
// The rank's rows for host ids i32 [T] (each in [0, vocab), else an error).
Tensor local_vocab_ids(const Tensor& ids, int64_t begin, int64_t count, int64_t vocab);
// logits f32 [L, N * part.dim(1)] from every rank's part f32 [L, V / N].
void gather_vocab_columns(Communicator& comm, Backend& backend, const Tensor& part, Tensor& logits);

}  // namespace tp
}  // namespace basalt

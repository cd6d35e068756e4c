#include "model/tp_shard.h"

#include <cstring>

#include "backend/communicator.h"
#include "core/error.h"

namespace basalt::tp {

void check_divides(int64_t world, int64_t value, const char* field) {
  BASALT_CHECK(value % world == 0, "tensor parallelism over {} ranks: {} ({}) must divide by it", world, field, value);
}

Tensor columns(const Tensor& t, int64_t begin, int64_t count) {
  BASALT_CHECK(t.device() == Device::kCpu && t.rank() == 2 && begin >= 0 && count >= 0 && begin + count <= t.dim(1),
               "tensor parallelism: columns [{}, {}) of {}", begin, begin + count, t.describe());
  const size_t elem = dtype_size(t.dtype());
  Tensor out = Tensor::empty({t.dim(0), count}, t.dtype());
  for (int64_t r = 0; r < t.dim(0); ++r)
    std::memcpy(out.data<char>() + static_cast<size_t>(r * count) * elem,
                static_cast<const char*>(t.raw()) + static_cast<size_t>(r * t.dim(1) + begin) * elem,
                static_cast<size_t>(count) * elem);
  return out;
}

Tensor vocab_shard(const Tensor& table, int64_t begin, int64_t count) {
  BASALT_CHECK(table.device() == Device::kCpu && table.rank() == 2 && begin >= 0 && count > 0 &&
                   begin + count <= table.dim(0),
               "tensor parallelism: vocabulary rows [{}, {}) of {}", begin, begin + count, table.describe());
  Tensor shard = Tensor::zeros({count + 1, table.dim(1)}, table.dtype());
  std::memcpy(shard.raw(), table.rows(begin, count).raw(), static_cast<size_t>(count) * table.nbytes() /
                                                               static_cast<size_t>(table.dim(0)));
  return shard;
}

Tensor local_vocab_ids(const Tensor& ids, int64_t begin, int64_t count, int64_t vocab) {
  BASALT_CHECK(ids.device() == Device::kCpu && ids.dtype() == DType::kI32 && ids.rank() == 1,
               "forward: a tensor-parallel rank takes host token ids i32 [T], got {}", ids.describe());
  const int64_t T = ids.numel();
  Tensor local = Tensor::empty({T}, DType::kI32);
  for (int64_t i = 0; i < T; ++i) {
    const int32_t id = ids.data<const int32_t>()[i];
    BASALT_CHECK(id >= 0 && id < vocab, "forward: token id {} is outside the vocabulary ({})", id, vocab);
    const int64_t at = id - begin;
    local.data<int32_t>()[i] = static_cast<int32_t>(at >= 0 && at < count ? at : count);
  }
  return local;
}

void gather_vocab_columns(Communicator& comm, Backend& backend, const Tensor& part, Tensor& logits) {
  const int64_t world = comm.world_size(), L = part.dim(0), cols = part.dim(1);
  BASALT_CHECK(logits.rank() == 2 && logits.dim(0) == L && logits.dim(1) == world * cols &&
                   logits.device() == backend.device(),
               "forward: logits must be f32 [{}, {}] on the {} backend, got {}", L, world * cols, backend.name(),
               logits.describe());
  Tensor gathered = backend.empty({world * L, cols}, DType::kF32);
  comm.all_gather(part, gathered);
  if (backend.device() == Device::kCpu) {
    for (int64_t r = 0; r < world; ++r)
      for (int64_t i = 0; i < L; ++i)
        std::memcpy(logits.data<float>() + i * world * cols + r * cols,
                    gathered.data<const float>() + (r * L + i) * cols, static_cast<size_t>(cols) * sizeof(float));
    return;
  }
  // On a device, rank by rank beside the columns so far (a copy of the
  // row-prefix each time: N^2 / 2 column copies, small beside lm_head).
  if (world == 1) {
    backend.copy(gathered, logits);
    return;
  }
  Tensor so_far = gathered.rows(0, L);
  for (int64_t r = 1; r < world; ++r) {
    Tensor next = r + 1 == world ? logits : backend.empty({L, (r + 1) * cols}, DType::kF32);
    backend.concat_columns(so_far, gathered.rows(r * L, L), next);
    so_far = next;
  }
}

}  // namespace basalt::tp

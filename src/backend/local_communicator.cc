// The in-process communicator (backend/communicator.h): ranks are threads of
// one process sharing one state. Every collective is publish (each rank puts
// its buffers' addresses in its slot), barrier, compute (each rank writes
// only its own output, reading the others' inputs), barrier (so no rank
// reuses an input another is still reading).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "backend/communicator.h"
#include "backend/host_communicator.h"

#include "backend/backend.h"
#include "backend/rank_barrier.h"
#include "core/dtype.h"
#include "core/error.h"

namespace basalt {

void check_all_reduce(const Tensor& x, const char* who) {
  BASALT_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16, "{} all_reduce: x must be f32 or bf16, got {}",
               who, x.describe());
}

void check_all_gather(const Tensor& x, const Tensor& out, int world, const char* who) {
  BASALT_CHECK(x.rank() >= 1 && out.dtype() == x.dtype() && out.rank() == x.rank() &&
                   out.dim(0) == x.dim(0) * world && out.numel() == x.numel() * world,
               "{} all_gather: out must be {} [{} x {} rows, ...] like x, got x {} out {}", who,
               dtype_name(x.dtype()), world, x.rank() >= 1 ? x.dim(0) : 0, x.describe(), out.describe());
}

void check_reduce_scatter(const Tensor& x, const Tensor& out, int world, const char* who) {
  BASALT_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16,
               "{} reduce_scatter: x must be f32 or bf16, got {}", who, x.describe());
  BASALT_CHECK(x.rank() >= 1 && out.dtype() == x.dtype() && out.rank() == x.rank() &&
                   x.dim(0) == out.dim(0) * world && x.numel() == out.numel() * world,
               "{} reduce_scatter: x must be {} [{} x {} rows, ...] like out, got x {} out {}", who,
               dtype_name(out.dtype()), world, out.rank() >= 1 ? out.dim(0) : 0, x.describe(), out.describe());
}

void check_all_to_all(const Tensor& send, std::span<const int64_t> send_rows, const Tensor& recv,
                      std::span<const int64_t> recv_rows, int world, const char* who) {
  BASALT_CHECK(send_rows.size() == static_cast<size_t>(world) && recv_rows.size() == static_cast<size_t>(world),
               "{} all_to_all: {} send and {} receive counts for {} ranks", who, send_rows.size(), recv_rows.size(),
               world);
  BASALT_CHECK(send.rank() >= 1 && recv.rank() == send.rank() && recv.dtype() == send.dtype(),
               "{} all_to_all: send {} and recv {} must have the same dtype and rank", who, send.describe(),
               recv.describe());
  for (int64_t r = 1; r < send.rank(); ++r)
    BASALT_CHECK(send.dim(r) == recv.dim(r), "{} all_to_all: rows of send {} and recv {} differ", who,
                 send.describe(), recv.describe());
  int64_t sent = 0, received = 0;
  for (int64_t n : send_rows) {
    BASALT_CHECK(n >= 0, "{} all_to_all: negative send count", who);
    sent += n;
  }
  for (int64_t n : recv_rows) {
    BASALT_CHECK(n >= 0, "{} all_to_all: negative receive count", who);
    received += n;
  }
  BASALT_CHECK(sent == send.dim(0) && received == recv.dim(0),
               "{} all_to_all: counts add up to {} sent and {} received rows, tensors have {} and {}", who, sent,
               received, send.dim(0), recv.dim(0));
}

void check_broadcast(int root, int world, const char* who) {
  BASALT_CHECK(root >= 0 && root < world, "{} broadcast: root {} is not a rank of {}", who, root, world);
}

namespace {

struct Shared {
  explicit Shared(int world)
      : world(world),
        ranks(world),
        in(static_cast<size_t>(world)),
        out(static_cast<size_t>(world)),
        counts(static_cast<size_t>(world)),
        bytes(static_cast<size_t>(world)) {}

  // Waits until every rank has arrived; reusable.
  void barrier() { ranks.wait(); }

  const int world;
  RankBarrier ranks;
  std::vector<const void*> in;                   // per rank: the input it published
  std::vector<const void*> out;                  // per rank: its all_reduce slice's sums
  std::vector<std::span<const int64_t>> counts;  // per rank: all_to_all send counts
  std::vector<size_t> bytes;                     // per rank: its input's size
};

class LocalCommunicator final : public HostCommunicator {
 public:
  LocalCommunicator(std::shared_ptr<Shared> shared, int rank, Backend* staging)
      : HostCommunicator("local", staging), shared_(std::move(shared)), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return shared_->world; }

  void host_all_reduce(Tensor& x, ReduceOp op) override {
    // Each rank sums its own slice of the elements over every rank's input
    // (in rank order, so every rank gets the same bits), then every rank
    // copies every slice: world times less work per rank than each summing
    // everything.
    const auto n = static_cast<size_t>(x.numel());
    const auto world = static_cast<size_t>(shared_->world), me = static_cast<size_t>(rank_);
    auto slice_begin = [&](size_t r) { return n * r / world; };
    shared_->in[me] = x.raw();
    shared_->bytes[me] = x.nbytes();
    shared_->barrier();
    if (const std::string mismatch = size_mismatch("all_reduce"); !mismatch.empty()) {
      shared_->barrier();
      shared_->barrier();
      throw Error(mismatch);
    }
    const bool bf16 = x.dtype() == DType::kBF16;
    const size_t begin = slice_begin(me), end = slice_begin(me + 1);
    const std::vector<float> mine = reduce_published(begin, end, bf16, op);
    shared_->out[me] = mine.data();
    shared_->barrier();  // every input read, every slice summed
    for (size_t r = 0; r < world; ++r) {
      const float* sums = static_cast<const float*>(shared_->out[r]);
      store(x.raw(), slice_begin(r), sums, slice_begin(r + 1) - slice_begin(r), bf16);
    }
    shared_->barrier();  // every slice copied before its owner frees it
  }

  void host_reduce_scatter(const Tensor& x, Tensor& out, ReduceOp op) override {
    // Rank r sums block r over every rank's input in rank order: the same
    // arithmetic as all_reduce's slices, so the same bits.
    const auto n = static_cast<size_t>(out.numel()), me = static_cast<size_t>(rank_);
    shared_->in[me] = x.raw();
    shared_->bytes[me] = x.nbytes();
    shared_->barrier();
    if (const std::string mismatch = size_mismatch("reduce_scatter"); !mismatch.empty()) {
      shared_->barrier();
      throw Error(mismatch);
    }
    const bool bf16 = x.dtype() == DType::kBF16;
    const std::vector<float> mine = reduce_published(me * n, (me + 1) * n, bf16, op);
    store(out.raw(), 0, mine.data(), n, bf16);
    shared_->barrier();  // every input read before its owner reuses it
  }

  void host_all_gather(const Tensor& x, Tensor& out) override {
    shared_->in[static_cast<size_t>(rank_)] = x.raw();
    shared_->bytes[static_cast<size_t>(rank_)] = x.nbytes();
    shared_->barrier();
    if (const std::string mismatch = size_mismatch("all_gather"); !mismatch.empty()) {
      shared_->barrier();
      throw Error(mismatch);
    }
    const size_t bytes = x.nbytes();
    for (int r = 0; r < shared_->world; ++r)
      if (bytes > 0)
        std::memcpy(static_cast<char*>(out.raw()) + static_cast<size_t>(r) * bytes, shared_->in[static_cast<size_t>(r)],
                    bytes);
    shared_->barrier();
  }

  void host_all_to_all(const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                       std::span<const int64_t> recv_rows) override {
    shared_->in[static_cast<size_t>(rank_)] = send.raw();
    shared_->counts[static_cast<size_t>(rank_)] = send_rows;
    shared_->barrier();
    const size_t row_bytes = send.dim(0) > 0 ? send.nbytes() / static_cast<size_t>(send.dim(0))
                                             : recv.dim(0) > 0 ? recv.nbytes() / static_cast<size_t>(recv.dim(0)) : 0;
    // A disagreement between counts is reported after the closing barrier,
    // so that no rank is left waiting in it.
    std::string mismatch;
    size_t at = 0;
    for (int src = 0; src < shared_->world; ++src) {
      const std::span<const int64_t> theirs = shared_->counts[static_cast<size_t>(src)];
      const int64_t rows = theirs[static_cast<size_t>(rank_)];
      if (rows != recv_rows[static_cast<size_t>(src)]) {
        mismatch = fmt::format("local all_to_all: rank {} sends {} rows to rank {}, which expects {}", src, rows,
                               rank_, recv_rows[static_cast<size_t>(src)]);
        break;
      }
      const int64_t offset = std::accumulate(theirs.begin(), theirs.begin() + rank_, int64_t{0});
      const size_t bytes = static_cast<size_t>(rows) * row_bytes;
      if (bytes > 0)
        std::memcpy(static_cast<char*>(recv.raw()) + at,
                    static_cast<const char*>(shared_->in[static_cast<size_t>(src)]) +
                        static_cast<size_t>(offset) * row_bytes,
                    bytes);
      at += bytes;
    }
    shared_->barrier();
    if (!mismatch.empty()) throw Error(mismatch);
  }

  void host_broadcast(Tensor& x, int root) override {
    shared_->in[static_cast<size_t>(rank_)] = x.raw();
    shared_->bytes[static_cast<size_t>(rank_)] = x.nbytes();
    shared_->barrier();
    if (const std::string mismatch = size_mismatch("broadcast"); !mismatch.empty()) {
      shared_->barrier();
      throw Error(mismatch);
    }
    if (rank_ != root && x.nbytes() > 0) std::memcpy(x.raw(), shared_->in[static_cast<size_t>(root)], x.nbytes());
    shared_->barrier();
  }

 private:
  // After the publishing barrier: empty when every rank's input has this
  // rank's size, else what differs (every rank sees the same sizes, so
  // every rank skips the exchange, passes the remaining barriers and
  // throws: a disagreement that NCCL would hang on or corrupt memory with).
  std::string size_mismatch(const char* what) const {
    const size_t mine = shared_->bytes[static_cast<size_t>(rank_)];
    for (int r = 0; r < shared_->world; ++r)
      if (shared_->bytes[static_cast<size_t>(r)] != mine)
        return fmt::format("local {}: rank {} has {} bytes, rank {} has {}: the ranks disagree on the size", what,
                           rank_, mine, r, shared_->bytes[static_cast<size_t>(r)]);
    return {};
  }

  // Elements [begin, end) summed (or maxed) over every rank's published
  // input, in rank order, in f32.
  std::vector<float> reduce_published(size_t begin, size_t end, bool bf16, ReduceOp op) const {
    auto load = [bf16](const void* p, size_t i) {
      return bf16 ? bf16_to_f32(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
    };
    std::vector<float> acc(end - begin);
    for (size_t r = 0; r < static_cast<size_t>(shared_->world); ++r) {
      const void* p = shared_->in[r];
      for (size_t i = begin; i < end; ++i) {
        const float v = load(p, i);
        float& a = acc[i - begin];
        a = r == 0 ? v : op == ReduceOp::kSum ? a + v : std::max(a, v);
      }
    }
    return acc;
  }

  // dst[at .. at + n) = values, rounded once into bf16 when bf16.
  static void store(void* dst, size_t at, const float* values, size_t n, bool bf16) {
    for (size_t i = 0; i < n; ++i) {
      if (bf16) static_cast<uint16_t*>(dst)[at + i] = f32_to_bf16(values[i]);
      else static_cast<float*>(dst)[at + i] = values[i];
    }
  }

  std::shared_ptr<Shared> shared_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_local_group(int world, std::span<Backend* const> staging) {
  BASALT_CHECK(world >= 1 && world <= 1024, "a communicator group needs 1..1024 ranks, got {}", world);
  BASALT_CHECK(staging.empty() || staging.size() == static_cast<size_t>(world),
               "a communicator group of {} ranks with {} staging backends", world, staging.size());
  auto shared = std::make_shared<Shared>(world);
  std::vector<std::unique_ptr<Communicator>> ranks;
  for (int r = 0; r < world; ++r)
    ranks.push_back(
        std::make_unique<LocalCommunicator>(shared, r, staging.empty() ? nullptr : staging[static_cast<size_t>(r)]));
  return ranks;
}

}  // namespace basalt

// The communicator over several machines (backend/communicator.h,
// make_node_group): this node's ranks are threads; each collective gathers
// every rank's input on every rank through the NodeLink (this node's ranks
// hand theirs to its first rank's thread, which makes the node's one
// exchange), and each rank then computes its own output from them with the
// in-process group's arithmetic (sums in rank order in f32, bf16 rounded
// once), so a model over nodes gives the bits of the same ranks in one
// process. Every rank moves every rank's input: simple and exact, not fast
// (NCCL is the way for GPUs at scale).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "backend/host_communicator.h"
#include "backend/node_link.h"
#include "backend/rank_barrier.h"
#include "core/dtype.h"
#include "core/error.h"

namespace basalt {
namespace {

// What this node's ranks share: the link, a barrier, and each exchange's
// inputs and results.
struct NodeShared {
  NodeShared(NodeLink& link, int local)
      : link(link), local(local), ranks(local), mine(static_cast<size_t>(local)) {}

  void barrier() { ranks.wait(); }

  // Every global rank's blob, in rank order, on every rank. Local rank i
  // hands in its own; the first local rank's thread packs the node's
  // blobs into one, exchanges it with the other nodes and unpacks them.
  const std::vector<std::string>& exchange(int i, std::string blob) {
    mine[static_cast<size_t>(i)] = std::move(blob);
    barrier();
    if (i == 0) {
      error.clear();
      try {
        std::string packed;
        for (const std::string& b : mine) {
          const uint64_t n = b.size();
          packed.append(reinterpret_cast<const char*>(&n), sizeof n);
          packed.append(b);
        }
        const std::vector<std::string> nodes = link.exchange(packed);
        all.clear();
        for (size_t k = 0; k < nodes.size(); ++k) {
          size_t at = 0;
          for (int r = 0; r < local; ++r) {
            uint64_t n = 0;
            BASALT_CHECK(at + sizeof n <= nodes[k].size(), "node link: node {} sent a short exchange", k);
            std::memcpy(&n, nodes[k].data() + at, sizeof n);
            at += sizeof n;
            BASALT_CHECK(n <= nodes[k].size() - at, "node link: node {} sent a short exchange", k);
            all.emplace_back(nodes[k].data() + at, static_cast<size_t>(n));
            at += static_cast<size_t>(n);
          }
          BASALT_CHECK(at == nodes[k].size(), "node link: node {} sent more than its ranks' inputs", k);
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    barrier();
    if (!error.empty()) throw Error(error);
    return all;
  }

  NodeLink& link;
  const int local;
  RankBarrier ranks;
  std::vector<std::string> mine;  // per local rank: its blob for the exchange under way
  std::vector<std::string> all;   // per global rank: the last exchange's blobs
  std::string error;              // the last exchange's failure, or empty
};

std::string bytes_of(const Tensor& t) { return std::string(static_cast<const char*>(t.raw()), t.nbytes()); }

class NodeCommunicator final : public HostCommunicator {
 public:
  NodeCommunicator(std::shared_ptr<NodeShared> shared, int local_index, int rank, int world, Backend* staging)
      : HostCommunicator("node", staging), shared_(std::move(shared)), local_index_(local_index), rank_(rank),
        world_(world) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  void host_all_reduce(Tensor& x, ReduceOp op) override {
    const std::vector<std::string>& all = shared_->exchange(local_index_, bytes_of(x));
    check_sizes(all, x.nbytes(), "all_reduce");
    reduce(all, 0, static_cast<size_t>(x.numel()), x.dtype() == DType::kBF16, op, x.raw());
  }

  void host_reduce_scatter(const Tensor& x, Tensor& out, ReduceOp op) override {
    const std::vector<std::string>& all = shared_->exchange(local_index_, bytes_of(x));
    check_sizes(all, x.nbytes(), "reduce_scatter");
    const auto n = static_cast<size_t>(out.numel()), me = static_cast<size_t>(rank_);
    reduce(all, me * n, n, x.dtype() == DType::kBF16, op, out.raw());
  }

  void host_all_gather(const Tensor& x, Tensor& out) override {
    const std::vector<std::string>& all = shared_->exchange(local_index_, bytes_of(x));
    check_sizes(all, x.nbytes(), "all_gather");
    for (size_t r = 0; r < all.size(); ++r)
      if (!all[r].empty()) std::memcpy(static_cast<char*>(out.raw()) + r * x.nbytes(), all[r].data(), x.nbytes());
  }

  void host_all_to_all(const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                       std::span<const int64_t> recv_rows) override {
    // A rank's blob: its send counts, then its rows.
    std::string blob(static_cast<size_t>(world_) * sizeof(int64_t), '\0');
    std::memcpy(blob.data(), send_rows.data(), blob.size());
    blob += bytes_of(send);
    const std::vector<std::string>& all = shared_->exchange(local_index_, std::move(blob));
    size_t row_bytes = dtype_size(recv.dtype());
    for (int64_t d = 1; d < recv.rank(); ++d) row_bytes *= static_cast<size_t>(recv.dim(d));
    std::string mismatch;
    size_t at = 0;
    for (int src = 0; src < world_ && mismatch.empty(); ++src) {
      const std::string& theirs = all[static_cast<size_t>(src)];
      std::vector<int64_t> counts(static_cast<size_t>(world_));
      if (theirs.size() < counts.size() * sizeof(int64_t)) {
        mismatch = fmt::format("node all_to_all: rank {} sent no counts", src);
        break;
      }
      std::memcpy(counts.data(), theirs.data(), counts.size() * sizeof(int64_t));
      const int64_t rows = counts[static_cast<size_t>(rank_)];
      const int64_t offset = std::accumulate(counts.begin(), counts.begin() + rank_, int64_t{0});
      const size_t header = counts.size() * sizeof(int64_t);
      if (rows != recv_rows[static_cast<size_t>(src)]) {
        mismatch = fmt::format("node all_to_all: rank {} sends {} rows to rank {}, which expects {}", src, rows,
                               rank_, recv_rows[static_cast<size_t>(src)]);
      } else if (offset < 0 || header + static_cast<size_t>(offset + rows) * row_bytes > theirs.size()) {
        mismatch = fmt::format("node all_to_all: rank {} sent fewer rows than its counts say", src);
      } else if (rows > 0) {
        std::memcpy(static_cast<char*>(recv.raw()) + at, theirs.data() + header + static_cast<size_t>(offset) * row_bytes,
                    static_cast<size_t>(rows) * row_bytes);
        at += static_cast<size_t>(rows) * row_bytes;
      }
    }
    if (!mismatch.empty()) throw Error(mismatch);
  }

  void host_broadcast(Tensor& x, int root) override {
    // Only the root's bytes travel; the others say how many they expect.
    std::string blob = rank_ == root ? bytes_of(x) : std::to_string(x.nbytes());
    const std::vector<std::string>& all = shared_->exchange(local_index_, std::move(blob));
    const std::string& from = all[static_cast<size_t>(root)];
    for (int r = 0; r < world_; ++r) {
      const std::string& b = all[static_cast<size_t>(r)];
      const size_t expects = r == root ? b.size() : static_cast<size_t>(std::stoull(b.empty() ? "0" : b));
      if (expects != from.size())
        fail("node broadcast: rank {} has {} bytes, root {} has {}: the ranks disagree on the size", r, expects, root,
             from.size());
    }
    if (rank_ != root && !from.empty()) std::memcpy(x.raw(), from.data(), from.size());
  }

 private:
  // Every rank's input has this rank's size, or every rank throws (they
  // all see the same sizes).
  void check_sizes(const std::vector<std::string>& all, size_t mine, const char* what) const {
    for (size_t r = 0; r < all.size(); ++r)
      if (all[r].size() != mine)
        fail("node {}: rank {} has {} bytes, rank {} has {}: the ranks disagree on the size", what, rank_, mine, r,
             all[r].size());
  }

  // dst[0 .. n) = elements [begin, begin + n) summed (or maxed) over every
  // rank's input in rank order, in f32, rounded once into bf16 when bf16.
  static void reduce(const std::vector<std::string>& all, size_t begin, size_t n, bool bf16, ReduceOp op, void* dst) {
    auto load = [bf16](const std::string& b, size_t i) {
      if (bf16) {
        uint16_t v;
        std::memcpy(&v, b.data() + i * 2, 2);
        return bf16_to_f32(v);
      }
      float v;
      std::memcpy(&v, b.data() + i * 4, 4);
      return v;
    };
    for (size_t i = 0; i < n; ++i) {
      float a = load(all[0], begin + i);
      for (size_t r = 1; r < all.size(); ++r) {
        const float v = load(all[r], begin + i);
        a = op == ReduceOp::kSum ? a + v : std::max(a, v);
      }
      if (bf16) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(a);
      else static_cast<float*>(dst)[i] = a;
    }
  }

  std::shared_ptr<NodeShared> shared_;
  int local_index_, rank_, world_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_node_group(NodeLink& link, int local_ranks,
                                                           std::span<Backend* const> staging) {
  BASALT_CHECK(local_ranks >= 1 && local_ranks <= 1024, "a node's group needs 1..1024 ranks, got {}", local_ranks);
  BASALT_CHECK(staging.empty() || staging.size() == static_cast<size_t>(local_ranks),
               "a node's group of {} ranks with {} staging backends", local_ranks, staging.size());
  auto shared = std::make_shared<NodeShared>(link, local_ranks);
  const int world = link.nnodes() * local_ranks, first = link.node_rank() * local_ranks;
  std::vector<std::unique_ptr<Communicator>> ranks;
  for (int i = 0; i < local_ranks; ++i)
    ranks.push_back(std::make_unique<NodeCommunicator>(shared, i, first + i, world,
                                                       staging.empty() ? nullptr : staging[static_cast<size_t>(i)]));
  return ranks;
}

}  // namespace basalt

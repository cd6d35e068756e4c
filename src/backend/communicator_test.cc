// The in-process communicator, ranks as threads, and the group over nodes
// (make_node_group: nodes as threads of this process, linked over loopback
// sockets): every collective against what it means computed directly, for
// 1 to 5 ranks on one node and 2 to 6 over 2 and 3 nodes, and a
// row-parallel linear layer (each rank holds a slice of K, partial products
// summed by all_reduce) that gives the whole layer's output, as tensor
// parallelism uses it; the node link's introductions and a node that goes
// away.
#include "backend/communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/node_link.h"
#include "core/dtype.h"
#include "core/error.h"
#include "testing/node_links.h"

namespace basalt {
namespace {

// world ranks over `nodes` nodes (1: the in-process group).
struct Layout {
  int world;
  int nodes = 1;
};
void PrintTo(const Layout& l, std::ostream* os) { *os << l.world << " ranks over " << l.nodes << " nodes"; }

// Runs body(rank, communicator) on one thread per rank and waits.
void on_ranks(const Layout& layout, const std::function<void(int, Communicator&)>& body) {
  std::vector<std::unique_ptr<NodeLink>> links;
  std::vector<std::unique_ptr<Communicator>> group;
  if (layout.nodes == 1) {
    group = make_local_group(layout.world);
  } else {
    links = testing::connect_node_links(layout.nodes);
    for (auto& link : links)
      for (auto& c : make_node_group(*link, layout.world / layout.nodes)) group.push_back(std::move(c));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < layout.world; ++r)
    threads.emplace_back([&, r] {
      Communicator& c = *group[static_cast<size_t>(r)];
      EXPECT_EQ(c.rank(), r);
      body(r, c);
    });
  for (auto& t : threads) t.join();
}

float value(int rank, int64_t i) { return static_cast<float>((rank + 1) * 10 + i % 7) - 3.5f; }

class LocalGroup : public ::testing::TestWithParam<Layout> {};

TEST_P(LocalGroup, AllReduceSumsAndMaxesEveryElement) {
  const int world = GetParam().world;
  on_ranks(GetParam(), [&](int rank, Communicator& c) {
    EXPECT_EQ(c.rank(), rank);
    EXPECT_EQ(c.world_size(), world);
    for (int round = 0; round < 3; ++round) {  // collectives one after another reuse the group
      Tensor x = Tensor::empty({5, 3}, DType::kF32);
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = value(rank, i + round);
      Tensor y = Tensor::empty({5, 3}, DType::kF32);
      std::copy_n(x.data<float>(), x.numel(), y.data<float>());
      c.all_reduce(x, ReduceOp::kSum);
      c.all_reduce(y, ReduceOp::kMax);
      for (int64_t i = 0; i < x.numel(); ++i) {
        float sum = 0, max = value(0, i + round);
        for (int r = 0; r < world; ++r) {
          sum += value(r, i + round);
          max = std::max(max, value(r, i + round));
        }
        EXPECT_EQ(x.data<float>()[i], sum);
        EXPECT_EQ(y.data<float>()[i], max);
      }
    }
    Tensor b = Tensor::empty({4}, DType::kBF16);
    for (int64_t i = 0; i < 4; ++i) b.data<uint16_t>()[i] = f32_to_bf16(value(rank, i));
    c.all_reduce(b);
    for (int64_t i = 0; i < 4; ++i) {
      float sum = 0;
      for (int r = 0; r < world; ++r) sum += bf16_to_f32(f32_to_bf16(value(r, i)));
      EXPECT_EQ(bf16_to_f32(b.data<uint16_t>()[i]), bf16_to_f32(f32_to_bf16(sum)));
    }
  });
}

TEST_P(LocalGroup, AllGatherAndBroadcast) {
  const int world = GetParam().world;
  on_ranks(GetParam(), [&](int rank, Communicator& c) {
    Tensor x = Tensor::empty({2, 3}, DType::kI32);
    for (int64_t i = 0; i < 6; ++i) x.data<int32_t>()[i] = rank * 100 + static_cast<int32_t>(i);
    Tensor out = Tensor::empty({2 * world, 3}, DType::kI32);
    c.all_gather(x, out);
    for (int r = 0; r < world; ++r)
      for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(out.data<int32_t>()[r * 6 + i], r * 100 + i);
    const int root = world - 1;
    Tensor y = Tensor::empty({3}, DType::kF32);
    for (int64_t i = 0; i < 3; ++i) y.data<float>()[i] = value(rank, i);
    c.broadcast(y, root);
    for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(y.data<float>()[i], value(root, i));
  });
}

// Each rank keeps its block of the sum: exactly the all_reduce's bits for
// that block (f32 sums and maxes, bf16 rounded once), over 2 rows per rank.
TEST_P(LocalGroup, ReduceScatterKeepsEachRankItsBlockOfTheAllReduce) {
  const int world = GetParam().world;
  on_ranks(GetParam(), [&](int rank, Communicator& c) {
    for (const DType dtype : {DType::kF32, DType::kBF16})
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        Tensor x = Tensor::empty({2 * world, 3}, dtype);
        for (int64_t i = 0; i < x.numel(); ++i) {
          const float v = value(rank, i) * (i % 2 == 0 ? 1.0f : -0.37f);
          if (dtype == DType::kF32) x.data<float>()[i] = v;
          else x.data<uint16_t>()[i] = f32_to_bf16(v);
        }
        Tensor all = Tensor::empty(x.shape(), dtype);
        std::copy_n(static_cast<const char*>(x.raw()), x.nbytes(), static_cast<char*>(all.raw()));
        c.all_reduce(all, op);
        Tensor mine = Tensor::empty({2, 3}, dtype);
        c.reduce_scatter(x, mine, op);
        EXPECT_EQ(std::memcmp(mine.raw(), static_cast<const char*>(all.raw()) + rank * mine.nbytes(), mine.nbytes()),
                  0)
            << "rank " << rank << " " << dtype_name(dtype) << (op == ReduceOp::kSum ? " sum" : " max");
      }
    // And against the sum written out, f32.
    Tensor x = Tensor::empty({world, 4}, DType::kF32);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = value(rank, i);
    Tensor mine = Tensor::empty({1, 4}, DType::kF32);
    c.reduce_scatter(x, mine);
    for (int64_t i = 0; i < 4; ++i) {
      float sum = 0;
      for (int r = 0; r < world; ++r) sum += value(r, rank * 4 + i);
      EXPECT_EQ(mine.data<float>()[i], sum);
    }
  });
}

// MoE-style dispatch: rank s sends (s + r) % 3 rows to rank r, each row
// tagged with (source, destination, index); everyone checks what arrived.
TEST_P(LocalGroup, AllToAllMovesUnevenBlocksOfRows) {
  const int world = GetParam().world;
  const auto rows = [](int from, int to) { return static_cast<int64_t>((from + to) % 3); };
  on_ranks(GetParam(), [&](int rank, Communicator& c) {
    std::vector<int64_t> send_rows, recv_rows;
    int64_t sending = 0, receiving = 0;
    for (int r = 0; r < world; ++r) {
      send_rows.push_back(rows(rank, r));
      recv_rows.push_back(rows(r, rank));
      sending += send_rows.back();
      receiving += recv_rows.back();
    }
    Tensor send = Tensor::empty({sending, 3}, DType::kI32), recv = Tensor::empty({receiving, 3}, DType::kI32);
    int64_t at = 0;
    for (int r = 0; r < world; ++r)
      for (int64_t i = 0; i < send_rows[static_cast<size_t>(r)]; ++i, ++at) {
        send.data<int32_t>()[at * 3 + 0] = rank;
        send.data<int32_t>()[at * 3 + 1] = r;
        send.data<int32_t>()[at * 3 + 2] = static_cast<int32_t>(i);
      }
    c.all_to_all(send, send_rows, recv, recv_rows);
    at = 0;
    for (int src = 0; src < world; ++src)
      for (int64_t i = 0; i < recv_rows[static_cast<size_t>(src)]; ++i, ++at) {
        EXPECT_EQ(recv.data<int32_t>()[at * 3 + 0], src);
        EXPECT_EQ(recv.data<int32_t>()[at * 3 + 1], rank);
        EXPECT_EQ(recv.data<int32_t>()[at * 3 + 2], i);
      }
  });
}

// Tensor parallelism's row-parallel linear: rank r holds columns
// [r*K/w, (r+1)*K/w) of the weight and of the input; the all-reduced partial
// products are the whole layer's output.
TEST_P(LocalGroup, RowParallelLinearEqualsTheWholeLayer) {
  const int world = GetParam().world;
  const int64_t T = 3, N = 8, K = 12 * world;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-1, 1);
  Tensor x = Tensor::empty({T, K}, DType::kF32), w = Tensor::empty({N, K}, DType::kF32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = d(rng);
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = d(rng);
  CpuBackend whole_backend;
  Tensor want = Tensor::empty({T, N}, DType::kF32);
  whole_backend.linear(x, w, nullptr, want);
  on_ranks(GetParam(), [&](int rank, Communicator& c) {
    CpuBackend backend;
    const int64_t k = K / world, k0 = rank * k;
    Tensor xs = Tensor::empty({T, k}, DType::kF32), ws = Tensor::empty({N, k}, DType::kF32);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) xs.data<float>()[t * k + j] = x.data<float>()[t * K + k0 + j];
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < k; ++j) ws.data<float>()[n * k + j] = w.data<float>()[n * K + k0 + j];
    Tensor partial = Tensor::empty({T, N}, DType::kF32);
    backend.linear(xs, ws, nullptr, partial);
    c.all_reduce(partial);
    for (int64_t i = 0; i < partial.numel(); ++i) EXPECT_NEAR(partial.data<float>()[i], want.data<float>()[i], 1e-4);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, LocalGroup,
                         ::testing::Values(Layout{1}, Layout{2}, Layout{3}, Layout{5}, Layout{2, 2}, Layout{4, 2},
                                           Layout{6, 3}),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return std::to_string(info.param.world) + "_ranks_" + std::to_string(info.param.nodes) +
                                  "_nodes";
                         });

// The same collectives give the same bits over nodes as in one process:
// 4 ranks as 2 nodes of 2 against the in-process group of 4, f32 and bf16.
TEST(NodeGroup, EveryCollectiveGivesTheInProcessGroupsBits) {
  const auto run = [](const Layout& layout) {
    std::vector<std::vector<std::string>> out(static_cast<size_t>(layout.world));
    on_ranks(layout, [&](int rank, Communicator& c) {
      std::mt19937 rng(static_cast<uint32_t>(rank + 3));
      std::uniform_real_distribution<float> d(-2, 2);
      const auto bytes = [](const Tensor& t) { return std::string(static_cast<const char*>(t.raw()), t.nbytes()); };
      for (const DType dtype : {DType::kF32, DType::kBF16}) {
        Tensor x = Tensor::empty({8, 5}, dtype);
        for (int64_t i = 0; i < x.numel(); ++i) {
          if (dtype == DType::kF32) x.data<float>()[i] = d(rng);
          else x.data<uint16_t>()[i] = f32_to_bf16(d(rng));
        }
        Tensor sum = Tensor::empty(x.shape(), dtype), block = Tensor::empty({2, 5}, dtype);
        std::memcpy(sum.raw(), x.raw(), x.nbytes());
        c.all_reduce(sum);
        c.reduce_scatter(x, block, ReduceOp::kMax);
        Tensor gathered = Tensor::empty({32, 5}, dtype);
        c.all_gather(x, gathered);
        c.broadcast(x, 2);
        for (const Tensor* t : {&sum, &block, &gathered, &x}) out[static_cast<size_t>(rank)].push_back(bytes(*t));
      }
    });
    return out;
  };
  EXPECT_EQ(run(Layout{4, 2}), run(Layout{4}));
}

// Ranks that disagree on a collective's size (which NCCL would hang on, or
// corrupt memory with) all throw, naming it, and the group stays usable;
// in one process and over nodes.
TEST(LocalGroup, RanksDisagreeingOnTheSizeAllThrow) {
  for (const Layout layout : {Layout{2}, Layout{2, 2}}) {
    on_ranks(layout, [&](int rank, Communicator& c) {
      const int64_t rows = rank + 1;
      Tensor x = Tensor::zeros({2 * rows, 2}, DType::kF32);
      Tensor gathered = Tensor::empty({2 * 2 * rows, 2}, DType::kF32), block = Tensor::empty({rows, 2}, DType::kF32);
      const auto disagree = [](const std::function<void()>& call) {
        try {
          call();
        } catch (const Error& e) {
          return std::string(e.what()).find("disagree") != std::string::npos;
        }
        return false;
      };
      EXPECT_TRUE(disagree([&] { c.all_reduce(x); }));
      EXPECT_TRUE(disagree([&] { c.all_gather(x, gathered); }));
      EXPECT_TRUE(disagree([&] { c.reduce_scatter(x, block); }));
      EXPECT_TRUE(disagree([&] { c.broadcast(x, 0); }));
      Tensor same = Tensor::from_f32({3}, std::vector<float>{1.0f, 1.0f, 1.0f});
      c.all_reduce(same);
      EXPECT_EQ(same.data<float>()[2], 2.0f);
    });
  }
}

// A node whose introduction does not match the leader's is refused with
// the reason, and the leader waits on for the right one; nodes that never
// come are named when the wait runs out; a node that cannot reach a leader
// says so.
TEST(NodeLink, IntroductionsAreCheckedAndTheWaitIsBounded) {
  NodeLinkOptions options;
  options.nnodes = 2;
  options.fingerprint = "model a, tp 2";
  options.join_timeout = std::chrono::seconds(20);
  std::promise<int> port;
  NodeLinkOptions lead = options;
  lead.on_listening = [&](int p) { port.set_value(p); };
  std::unique_ptr<NodeLink> leader;
  std::thread leading([&] { leader = NodeLink::lead("127.0.0.1:0", lead); });
  const std::string address = "127.0.0.1:" + std::to_string(port.get_future().get());
  NodeLinkOptions other = options;
  other.fingerprint = "model b, tp 2";
  try {
    NodeLink::join(address, 1, other);
    ADD_FAILURE() << "a node running another model joined";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("refused node 1: it runs 'model b, tp 2', the leader 'model a, tp 2'"),
              std::string::npos)
        << e.what();
  }
  NodeLinkOptions more = options;
  more.nnodes = 3;
  try {
    NodeLink::join(address, 1, more);
    ADD_FAILURE() << "a node of another node count joined";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("it runs with --nnodes 3, the leader with 2"), std::string::npos)
        << e.what();
  }
  std::unique_ptr<NodeLink> joined = NodeLink::join(address, 1, options);
  leading.join();
  ASSERT_NE(leader, nullptr);
  std::vector<std::string> seen;
  std::thread peer([&] { seen = joined->exchange("from 1"); });
  EXPECT_EQ(leader->exchange("from 0"), (std::vector<std::string>{"from 0", "from 1"}));
  peer.join();
  EXPECT_EQ(seen, (std::vector<std::string>{"from 0", "from 1"}));

  NodeLinkOptions alone = options;
  alone.nnodes = 3;
  alone.join_timeout = std::chrono::milliseconds(300);
  try {
    NodeLink::lead("127.0.0.1:0", alone);
    ADD_FAILURE() << "a leader without its nodes started";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nodes 1, 2 of 3 did not join"), std::string::npos) << e.what();
  }
  NodeLinkOptions nobody = options;
  nobody.join_timeout = std::chrono::milliseconds(300);
  EXPECT_THROW(NodeLink::join("127.0.0.1:1", 1, nobody), Error);  // nothing listens on port 1
  EXPECT_THROW(NodeLink::join("no-port", 1, nobody), Error);
}

// A node that goes away breaks the link: the exchange under way throws,
// naming it, and so does every later one; over a node group, every local
// rank's collective throws.
TEST(NodeLink, ANodeThatGoesAwayBreaksTheLink) {
  auto links = testing::connect_node_links(2);
  links[1].reset();
  try {
    links[0]->exchange("hello");
    ADD_FAILURE() << "an exchange with a node gone completed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(links[0]->exchange("again"), Error);
  auto group = make_node_group(*links[0], 2);
  std::vector<std::thread> threads;
  std::atomic<int> thrown{0};
  for (auto& c : group)
    threads.emplace_back([&, comm = c.get()] {
      Tensor x = Tensor::zeros({4}, DType::kF32);
      try {
        comm->all_reduce(x);
      } catch (const Error&) {
        ++thrown;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(thrown.load(), 2);
}

TEST(LocalGroup, BadArgumentsThrowBeforeTheCollective) {
  auto group = make_local_group(2);
  Communicator& c = *group[0];
  Tensor i32 = Tensor::empty({4}, DType::kI32);
  EXPECT_THROW(c.all_reduce(i32), Error);
  Tensor x = Tensor::empty({2, 3}, DType::kF32), out = Tensor::empty({3, 3}, DType::kF32);
  EXPECT_THROW(c.all_gather(x, out), Error);
  const std::vector<int64_t> two = {1, 1}, one = {2};
  Tensor recv = Tensor::empty({2, 3}, DType::kF32);
  EXPECT_THROW(c.all_to_all(x, one, recv, two), Error);
  EXPECT_THROW(c.all_to_all(x, std::vector<int64_t>{2, 1}, recv, two), Error);
  EXPECT_THROW(c.broadcast(x, 2), Error);
  Tensor three = Tensor::empty({3, 3}, DType::kF32), one_row = Tensor::empty({1, 3}, DType::kF32);
  EXPECT_THROW(c.reduce_scatter(three, one_row), Error);  // 3 rows do not split over 2 ranks
  EXPECT_THROW(c.reduce_scatter(x, x), Error);            // out must be x's rows / world
  Tensor ints = Tensor::empty({2, 3}, DType::kI32), int_row = Tensor::empty({1, 3}, DType::kI32);
  EXPECT_THROW(c.reduce_scatter(ints, int_row), Error);
  EXPECT_THROW(make_local_group(0), Error);
}

}  // namespace
}  // namespace basalt

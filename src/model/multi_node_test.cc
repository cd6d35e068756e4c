// Tensor parallelism over nodes on the CPU: the nodes are threads of this
// process with links over loopback sockets (the same code two machines
// run), the leader's model driven as an engine drives it and the other
// nodes serving it. Outputs are byte for byte those of the same ranks in
// one process (the node group sums as the in-process group does), and
// transformers' greedy tokens; the MTP head runs over nodes too; errors
// reach the leader and leave every node usable; a stale KV is refused; the
// workers stop with the leader and fail when the link breaks.
#include "model/multi_node.h"

#include <gtest/gtest.h>

#include <thread>

#include "backend/communicator.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/node_link.h"
#include "core/error.h"
#include "model/safetensors.h"
#include "model/tensor_parallel.h"
#include "runtime/generator.h"
#include "testing/backend_test_util.h"
#include "testing/node_links.h"
#include "testing/reference_test_util.h"

namespace basalt {
namespace {

const std::string kModels = std::string(BASALT_TESTDATA) + "/models/";

std::unique_ptr<Backend> rank_backend(int) { return make_cpu_backend_with_threads(1, cpu::Bf16Activations::kF32); }

// `nodes` nodes of `local` ranks each: the leader's Model, with the other
// nodes serving it on threads until it is destroyed.
class Nodes {
 public:
  Nodes(const std::string& name, int nodes, int local) : links_(testing::connect_node_links(nodes)) {
    std::vector<std::unique_ptr<Model>> models(static_cast<size_t>(nodes));
    std::vector<std::thread> loading;
    for (int k = 0; k < nodes; ++k)
      loading.emplace_back([&, k] {
        NodeLink& link = *links_[static_cast<size_t>(k)];
        models[static_cast<size_t>(k)] = load_tensor_parallel(
            kModels + name, local, rank_backend, {}, nullptr,
            [&link, local](std::span<Backend* const>) { return make_node_group(link, local); });
      });
    for (std::thread& t : loading) t.join();
    for (int k = 1; k < nodes; ++k)
      workers_.emplace_back([this, k, model = std::shared_ptr<Model>(std::move(models[static_cast<size_t>(k)]))] {
        CpuBackend scratch;
        try {
          serve_multi_node_worker(*links_[static_cast<size_t>(k)], *model, scratch);
        } catch (const Error& e) {
          worker_error_ = e.what();
        }
      });
    leader_ = make_multi_node_leader(std::move(links_[0]), std::move(models[0]), backend_);
  }
  ~Nodes() { stop(); }

  Model& leader() { return *leader_; }
  // Destroys the leader (it tells the others to stop) and waits for them.
  void stop() {
    leader_.reset();
    for (std::thread& t : workers_)
      if (t.joinable()) t.join();
  }
  const std::string& worker_error() const { return worker_error_; }

 private:
  CpuBackend backend_;
  std::vector<std::unique_ptr<NodeLink>> links_;
  std::vector<std::thread> workers_;
  std::unique_ptr<Model> leader_;
  std::string worker_error_;
};

std::vector<float> values(const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); }

// A prompt's logits (every row) and its greedy continuation's.
std::vector<float> prompt_logits(Model& model, const std::vector<int32_t>& ids) {
  KvBuffers kv = model.allocate_kv(static_cast<int64_t>(ids.size()));
  Tensor logits = Tensor::empty({static_cast<int64_t>(ids.size()), model.config().vocab_size}, DType::kF32);
  model.forward(single_sequence_batch(ids, 0, true), kv, logits);
  return values(logits);
}

struct Case {
  std::string model;
  int nodes, local;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << " over " << c.nodes << " nodes of " << c.local << " ranks";
}

class MultiNode : public ::testing::TestWithParam<Case> {};

TEST_P(MultiNode, GivesTheBitsOfTheSameRanksInOneProcessAndTransformersTokens) {
  const auto [name, nodes, local] = GetParam();
  Nodes group(name, nodes, local);
  auto one_process = load_tensor_parallel(kModels + name, nodes * local, rank_backend);
  const std::vector<int32_t> prompt = {3, 17, 42, 8, 99, 5};
  EXPECT_EQ(prompt_logits(group.leader(), prompt), prompt_logits(*one_process, prompt));
  CpuBackend sampler;
  testing::expect_greedy_matches_reference(group.leader(), sampler, kModels + name);
  EXPECT_NE(group.leader().summary().find("tensor parallel over " + std::to_string(nodes * local) + " ranks, ranks 0-" +
                                          std::to_string(local - 1) + " here"),
            std::string::npos)
      << group.leader().summary();
  EXPECT_NE(group.leader().summary().find("over " + std::to_string(nodes) + " nodes"), std::string::npos);
  group.stop();
  EXPECT_EQ(group.worker_error(), "");
}

// Dense (2 key/value heads: over 4 ranks each is held by two) and DeepSeek
// (experts split over the ranks of both nodes).
INSTANTIATE_TEST_SUITE_P(Layouts, MultiNode,
                         ::testing::Values(Case{"llama", 2, 1}, Case{"llama", 2, 2}, Case{"qwen3", 2, 1},
                                           Case{"deepseek_v3", 2, 1}, Case{"deepseek_v3", 2, 2}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.model + "_" + std::to_string(info.param.nodes) + "_nodes_of_" +
                                  std::to_string(info.param.local);
                         });

// DeepSeek's MTP layer as the draft head over nodes: the logits of the same
// head over the same ranks in one process, bit for bit.
TEST(MultiNode, TheMtpHeadDraftsOverNodes) {
  const std::string name = "deepseek_v3";
  const SafetensorsFile ref = SafetensorsFile::open(kModels + name + "/reference.safetensors");
  const Tensor ids = ref.tensor("mtp.ids"), next = ref.tensor("mtp.next_ids"), want = ref.tensor("mtp.logits");
  const int64_t n = ids.numel();
  const auto head_logits = [&](Model& model) {
    const int64_t H = model.config().hidden_size, V = model.config().vocab_size;
    Tensor logits = Tensor::empty({n, V}, DType::kF32), hidden = Tensor::empty({n, H}, DType::kF32);
    KvBuffers kv = model.allocate_kv(n);
    model.forward(single_sequence_batch(testing::ids_of(ids), 0, true), kv, logits, &hidden);
    DraftHead& head = *model.draft_head();
    KvBuffers head_kv = head.allocate_kv(n);
    Tensor out = Tensor::empty({n, V}, DType::kF32), hidden_out = Tensor::empty({n, H}, DType::kF32);
    head.forward(single_sequence_batch(testing::ids_of(next), 0, true), hidden, head_kv, out, &hidden_out);
    EXPECT_LT(testing::relative_error(out, want), 1e-4);
    return values(out);
  };
  Nodes group(name, 2, 1);
  ASSERT_NE(group.leader().draft_head(), nullptr);
  auto one_process = load_tensor_parallel(kModels + name, 2, rank_backend);
  EXPECT_EQ(head_logits(group.leader()), head_logits(*one_process));
}

// A bad batch fails on every node and reaches the caller; a wrong output
// tensor is refused before any node starts; a KV replaced by a later
// allocation is refused; after each, the nodes still answer.
TEST(MultiNode, ErrorsReachTheLeaderAndEveryNodeGoesOn) {
  Nodes group("llama", 2, 1);
  Model& model = group.leader();
  const int64_t vocab = model.config().vocab_size;
  const std::vector<int32_t> good = {3, 7, 11};
  const std::vector<float> expected = prompt_logits(model, good);
  KvBuffers kv = model.allocate_kv(8);
  Tensor logits = Tensor::empty({1, vocab}, DType::kF32);
  try {
    model.forward(single_sequence_batch(std::vector<int32_t>{3, static_cast<int32_t>(vocab)}, 0), kv, logits);
    ADD_FAILURE() << "a token outside the vocabulary ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(vocab)), std::string::npos) << e.what();
  }
  EXPECT_EQ(prompt_logits(model, good), expected);
  KvBuffers live = model.allocate_kv(8);
  Tensor wide = Tensor::empty({1, vocab + 1}, DType::kF32);
  EXPECT_THROW(model.forward(single_sequence_batch(good, 0), live, wide), Error);
  KvBuffers newer = model.allocate_kv(8);
  try {
    model.forward(single_sequence_batch(good, 0), live, logits);
    ADD_FAILURE() << "a replaced KV was used";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not the KV of the latest allocate_kv"), std::string::npos) << e.what();
  }
  EXPECT_EQ(prompt_logits(model, good), expected);
  group.stop();
  EXPECT_EQ(group.worker_error(), "");
}

// A worker whose leader goes away without a word (its link closed) fails,
// naming the leader's node.
TEST(MultiNode, AWorkerFailsWhenTheLinkBreaks) {
  auto links = testing::connect_node_links(2);
  auto local = load_tensor_parallel(kModels + "llama", 1, rank_backend, {}, nullptr,
                                    [&](std::span<Backend* const>) { return make_node_group(*links[1], 1); });
  std::string error;
  std::thread worker([&] {
    CpuBackend scratch;
    try {
      serve_multi_node_worker(*links[1], *local, scratch);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  links[0].reset();
  worker.join();
  EXPECT_NE(error.find("node 0"), std::string::npos) << error;
}

}  // namespace
}  // namespace basalt

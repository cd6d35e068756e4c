// DP attention with expert parallelism on the CPU, ranks as threads: the
// DeepSeek fixtures over 2 and 4 ranks against transformers, with every
// rank stepping at once and with one rank busy while the others serve their
// experts idle; ranks running different requests at once against one rank;
// a failing batch on one rank that leaves the others' results whole; and the
// layouts the group refuses. Tokens reach their experts both ways (DpMoe:
// the exchange, and gathering), and by gathering the dense MLPs and shared
// experts are whole on each rank or split over the ranks (dense_tp). With
// attention TP (SGLang's --dp below --tp) the ranks form DP groups of 2
// that split their attention heads, each group one DP rank.
#include "model/data_parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <random>
#include <span>
#include <thread>

#include "backend/communicator.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/deepseek_v3.h"
#include "model/safetensors.h"
#include "runtime/generator.h"
#include "testing/backend_test_util.h"
#include "testing/engine_test_util.h"
#include "testing/reference_test_util.h"
#include "testing/replaying_backend.h"

namespace basalt {
namespace {

const std::string kModels = std::string(BASALT_TESTDATA) + "/models/";

// Ranks with f32 activations (--dtype float32), for the 1e-4 comparisons
// with transformers' f32 runs (the default mode: tensor_parallel_test.cc).
// `world` ranks in DP groups of `attention_tp`.
std::unique_ptr<DataParallelGroup> load_over(const std::string& name, int world, DpMoe moe = DpMoe::kExchange,
                                             bool dense_tp = false, int attention_tp = 1) {
  return load_data_parallel(
      kModels + name, world, [](int) { return make_cpu_backend_with_threads(1, cpu::Bf16Activations::kF32); }, {},
      std::chrono::microseconds(1000), Weights::kCheckpoint, {}, moe, std::nullopt, dense_tp, attention_tp);
}

// Runs body(rank) on a thread per rank, at once.
void on_every_rank(int world, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(body, r);
  for (std::thread& t : threads) t.join();
}

struct Case {
  std::string model;
  int world;
  DpMoe moe = DpMoe::kExchange;
  bool dense_tp = false;
  int attention_tp = 1;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << " over " << c.world << " ranks" << (c.moe == DpMoe::kGather ? ", experts by gathering" : "")
      << (c.dense_tp ? ", dense MLPs split" : "")
      << (c.attention_tp > 1 ? ", DP groups of " + std::to_string(c.attention_tp) : "");
}

class DataParallelReference : public ::testing::TestWithParam<Case> {};

TEST_P(DataParallelReference, EveryRankAtOnceMatchesTransformers) {
  const auto [name, ranks, moe, dense_tp, attention_tp] = GetParam();
  auto group = load_over(name, ranks, moe, dense_tp, attention_tp);
  const int world = group->world();
  on_every_rank(world, [&](int r) {
    testing::expect_prefill_logits_match_reference(group->rank(r), kModels + name,
                                                   name + " rank " + std::to_string(r) + " of " +
                                                       std::to_string(world),
                                                   1e-4, 1e-2);
  });
}

TEST_P(DataParallelReference, OneBusyRankWithTheOthersIdleMatchesTransformersGreedy) {
  const auto [name, ranks, moe, dense_tp, attention_tp] = GetParam();
  auto group = load_over(name, ranks, moe, dense_tp, attention_tp);
  CpuBackend sampler;
  testing::expect_greedy_matches_reference(group->rank(group->world() - 1), sampler, kModels + name);
}

// Each rank generates from its own prompt (the fixture's greedy prompt cut
// by a different number of tokens), all at once: steps of different
// lengths meet in the same rounds, and ranks finish at different times.
TEST_P(DataParallelReference, RanksWithTheirOwnRequestsEqualOneRank) {
  const auto [name, ranks, moe, dense_tp, attention_tp] = GetParam();
  auto group = load_over(name, ranks, moe, dense_tp, attention_tp);
  const int world = group->world();
  CpuBackend backend;
  auto one = load_model(kModels + name, backend);
  const nlohmann::json meta = testing::read_json(kModels + name + "/reference.json");
  const std::vector<int32_t> prompt = meta["greedy_prompt"].get<std::vector<int32_t>>();
  GenerateOptions options;
  options.max_tokens = 6;
  options.temperature = 0.0f;
  options.ignore_eos = true;
  auto prompt_of = [&](int r) {
    const int64_t cut = std::min<int64_t>(r, static_cast<int64_t>(prompt.size()) - 1);
    return std::vector<int32_t>(prompt.begin(), prompt.end() - cut);
  };
  std::vector<GenerateResult> results(static_cast<size_t>(world));
  on_every_rank(world, [&](int r) {
    CpuBackend sampler;
    results[static_cast<size_t>(r)] = generate(group->rank(r), sampler, prompt_of(r), options);
  });
  CpuBackend sampler;
  for (int r = 0; r < world; ++r) {
    const GenerateResult alone = generate(*one, sampler, prompt_of(r), options);
    EXPECT_EQ(results[static_cast<size_t>(r)].output_ids, alone.output_ids) << "rank " << r;
  }
}

// V2-Lite: softmax routing, 8 experts (4 or 2 a rank), 2 shared; V3:
// grouped sigmoid routing, 16 experts (8 or 4 a rank); both with a dense
// first layer. Each over the exchange and by gathering (DpMoe), and by
// gathering with the dense MLPs and shared experts split (dense_tp); and 4
// ranks in two DP groups of 2 (attention TP) each way.
INSTANTIATE_TEST_SUITE_P(Families, DataParallelReference,
                         ::testing::Values(Case{"deepseek_v2_lite", 2}, Case{"deepseek_v2_lite", 4},
                                           Case{"deepseek_v3", 2}, Case{"deepseek_v3", 4},
                                           Case{"deepseek_v2_lite", 2, DpMoe::kGather},
                                           Case{"deepseek_v2_lite", 4, DpMoe::kGather},
                                           Case{"deepseek_v3", 2, DpMoe::kGather},
                                           Case{"deepseek_v3", 4, DpMoe::kGather},
                                           Case{"deepseek_v2_lite", 2, DpMoe::kGather, true},
                                           Case{"deepseek_v3", 2, DpMoe::kGather, true},
                                           Case{"deepseek_v3", 4, DpMoe::kGather, true},
                                           Case{"deepseek_v2_lite", 4, DpMoe::kExchange, false, 2},
                                           Case{"deepseek_v3", 4, DpMoe::kExchange, false, 2},
                                           Case{"deepseek_v3", 4, DpMoe::kGather, false, 2},
                                           Case{"deepseek_v2_lite", 4, DpMoe::kGather, true, 2},
                                           Case{"deepseek_v3", 4, DpMoe::kGather, true, 2}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.model + "_dp" + std::to_string(info.param.world) +
                                  (info.param.moe == DpMoe::kGather ? "_gather" : "") +
                                  (info.param.dense_tp ? "_dense_tp" : "") +
                                  (info.param.attention_tp > 1 ? "_attn_tp" + std::to_string(info.param.attention_tp)
                                                               : "");
                         });

void a_failing_batch_fails_alone(DpMoe moe, bool dense_tp, int attention_tp) {
  auto group = load_over("deepseek_v3", 2 * attention_tp, moe, dense_tp, attention_tp);
  CpuBackend backend(&ThreadPool::global(), cpu::Bf16Activations::kF32);  // as the ranks
  auto one = load_model(kModels + "deepseek_v3", backend);
  const int64_t vocab = group->rank(0).config().vocab_size;
  const std::vector<int32_t> good = {3, 7, 11}, bad = {3, static_cast<int32_t>(vocab), 11};
  auto step = [&](Model& m, const std::vector<int32_t>& ids) {
    KvBuffers kv = m.allocate_kv(8);
    Tensor logits = Tensor::empty({1, vocab}, DType::kF32);
    m.forward(single_sequence_batch(ids, 0), kv, logits);
    return std::vector<float>(logits.data<float>(), logits.data<float>() + vocab);
  };
  const std::vector<float> expected = step(*one, good);
  for (int round = 0; round < 3; ++round) {
    std::vector<float> got;
    bool failed = false;
    on_every_rank(2, [&](int r) {
      if (r == 0) {
        try {
          step(group->rank(0), bad);
        } catch (const Error& e) {
          failed = std::string(e.what()).find("outside the vocabulary") != std::string::npos ||
                   std::string(e.what()).find(std::to_string(vocab)) != std::string::npos;
        }
      } else {
        got = step(group->rank(1), good);
      }
    });
    EXPECT_TRUE(failed) << "round " << round;
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-4) << "logit " << i;
  }
  // A wrong output tensor is refused before the rank joins a round.
  KvBuffers kv = group->rank(1).allocate_kv(8);
  Tensor wide = Tensor::empty({1, vocab + 1}, DType::kF32);
  EXPECT_THROW(group->rank(1).forward(single_sequence_batch(good, 0), kv, wide), Error);
}

TEST(DataParallel, AFailingBatchFailsAloneAndTheGroupGoesOn) {
  for (const int attention_tp : {1, 2})
    for (const auto& [moe, dense_tp] :
         {std::pair{DpMoe::kExchange, false}, std::pair{DpMoe::kGather, false}, std::pair{DpMoe::kGather, true}}) {
      SCOPED_TRACE(std::string(moe == DpMoe::kGather ? "experts by gathering" : "experts by the exchange") +
                   (dense_tp ? ", dense MLPs split" : "") + ", DP groups of " + std::to_string(attention_tp));
      a_failing_batch_fails_alone(moe, dense_tp, attention_tp);
    }
}

// DP ranks by gathering without the group: each rank's model agrees the
// step's rows with the others itself (an all-gather of the counts), or
// takes what a caller that sees every batch set (set_step_rows, as the
// group's leader does; it holds until set again), also more than needed;
// a count below a rank's tokens fails that rank alone while the other's
// step completes. Each rank's logits are one model's on its own prompt (the
// prompts differ in length, so ranks pad).
TEST(DataParallel, GatheringRanksAgreeTheirRowsOrTakeTheCallersCount) {
  const std::string dir = kModels + "deepseek_v3";
  CpuBackend one_backend(&ThreadPool::global(), cpu::Bf16Activations::kF32);
  auto one = load_model(dir, one_backend);
  const int64_t vocab = one->config().vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {{3, 7, 11}, {5, 2, 9, 4, 13}};
  const auto logits_of = [&](Model& m, const std::vector<int32_t>& ids) {
    KvBuffers kv = m.allocate_kv(8);
    Tensor logits = Tensor::empty({1, vocab}, DType::kF32);
    m.forward(single_sequence_batch(ids, 0), kv, logits);
    return std::vector<float>(logits.data<float>(), logits.data<float>() + vocab);
  };
  std::vector<std::vector<float>> expected;
  for (const auto& p : prompts) expected.push_back(logits_of(*one, p));

  for (const bool dense_tp : {false, true}) {
    SCOPED_TRACE(dense_tp ? "dense MLPs split" : "dense MLPs whole");
    auto comms = make_local_group(2);
    std::vector<std::unique_ptr<CpuBackend>> backends;
    std::vector<std::unique_ptr<Model>> ranks(2);
    for (int r = 0; r < 2; ++r)
      backends.push_back(std::make_unique<CpuBackend>(&ThreadPool::global(), cpu::Bf16Activations::kF32));
    on_every_rank(2, [&](int r) {
      ranks[static_cast<size_t>(r)] =
          load_model(dir, *backends[static_cast<size_t>(r)], {},
                     RankRole{comms[static_cast<size_t>(r)].get(), true, DpMoe::kGather, dense_tp});
    });
    const auto rank_model = [&](int r) -> DeepseekModel& {
      return dynamic_cast<DeepseekModel&>(*ranks[static_cast<size_t>(r)]);
    };
    // -1: agreed by the ranks; the value holds until set again.
    for (const int64_t preset : {int64_t{-1}, int64_t{5}, int64_t{5}, int64_t{9}, int64_t{-1}}) {
      SCOPED_TRACE("rows " + std::to_string(preset));
      std::vector<std::vector<float>> got(2);
      on_every_rank(2, [&](int r) {
        rank_model(r).set_step_rows(preset);
        got[static_cast<size_t>(r)] = logits_of(rank_model(r), prompts[static_cast<size_t>(r)]);
      });
      for (size_t r = 0; r < 2; ++r) {
        ASSERT_EQ(got[r].size(), expected[r].size());
        for (size_t i = 0; i < got[r].size(); ++i) ASSERT_NEAR(got[r][i], expected[r][i], 1e-4) << "rank " << r;
      }
    }
    // 4 agreed rows: rank 1's 5 tokens do not fit; rank 0's 3 do.
    std::vector<float> zeroth;
    bool refused = false;
    on_every_rank(2, [&](int r) {
      rank_model(r).set_step_rows(4);
      if (r == 0) {
        zeroth = logits_of(rank_model(0), prompts[0]);
        return;
      }
      try {
        logits_of(rank_model(1), prompts[1]);
      } catch (const Error& e) {
        refused = std::string(e.what()).find("agreed 4") != std::string::npos;
      }
    });
    EXPECT_TRUE(refused);
    ASSERT_EQ(zeroth.size(), expected[0].size());
    for (size_t i = 0; i < zeroth.size(); ++i) EXPECT_NEAR(zeroth[i], expected[0][i], 1e-4);
  }
}

// Counts a rank's all-gathers and reduce-scatters, passing every
// collective to the in-process group.
class CountingCommunicator final : public testing::RecordableCommunicator {
 public:
  CountingCommunicator(std::unique_ptr<Communicator> inner, std::atomic<int>& gathers, std::atomic<int>& scatters)
      : RecordableCommunicator(std::move(inner)), gathers_(gathers), scatters_(scatters) {}
  void all_gather(const Tensor& x, Tensor& out) override {
    ++gathers_;
    RecordableCommunicator::all_gather(x, out);
  }
  void reduce_scatter(const Tensor& x, Tensor& out, ReduceOp op) override {
    ++scatters_;
    RecordableCommunicator::reduce_scatter(x, out, op);
  }

 private:
  std::atomic<int>& gathers_;
  std::atomic<int>& scatters_;
};

// Through the group, a step by gathering is one all-gather and one
// reduce-scatter per MoE layer and no more (with the dense MLPs split, per
// dense layer too: the shared experts join the MoE layers' own): the
// leader set the rows, so no rank gathered the counts.
TEST(DataParallel, TheGroupAgreesTheRowsSoNoRankGathersCounts) {
  for (const bool dense_tp : {false, true}) {
    SCOPED_TRACE(dense_tp ? "dense MLPs split" : "dense MLPs whole");
    std::atomic<int> gathers{0}, scatters{0};
    const RankGroupFactory counting = [&](std::span<Backend* const> backends) {
      std::vector<std::unique_ptr<Communicator>> out;
      for (auto& c : make_local_group(static_cast<int>(backends.size())))
        out.push_back(std::make_unique<CountingCommunicator>(std::move(c), gathers, scatters));
      return out;
    };
    auto group = load_data_parallel(
        kModels + "deepseek_v3", 2, [](int) { return make_cpu_backend_with_threads(1, cpu::Bf16Activations::kF32); },
        // Both ranks hand in their step within the wait, however slow the
        // build (a sanitizer's), so the step is one round.
        {}, std::chrono::seconds(30), Weights::kCheckpoint, counting, DpMoe::kGather, std::nullopt, dense_tp);
    const ModelConfig& config = group->rank(0).config();
    const int64_t vocab = config.vocab_size;
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < config.num_layers; ++l) moe_layers += config.deepseek.is_moe_layer(l) ? 1 : 0;
    ASSERT_LT(moe_layers, config.num_layers);  // the fixture has a dense layer
    const int64_t layers = dense_tp ? config.num_layers : moe_layers;
    gathers = 0;
    scatters = 0;
    on_every_rank(2, [&](int r) {
      KvBuffers kv = group->rank(r).allocate_kv(8);
      Tensor logits = Tensor::empty({1, vocab}, DType::kF32);
      const std::vector<int32_t> ids(static_cast<size_t>(2 + r), 5);
      group->rank(r).forward(single_sequence_batch(ids, 0), kv, logits);
    });
    EXPECT_EQ(scatters.load(), 2 * layers);  // both ranks
    EXPECT_EQ(gathers.load(), scatters.load());
  }
}

// Graphs on DP ranks (by gathering), with a backend whose replays re-run
// the recorded steps, collectives included: the ranks record together when
// the last engine hands in its KV, decode rounds replay every rank's graph
// of the round's largest batch (the ranks' batches differ, and ranks sit
// idle in some rounds), prompts run directly; every request's greedy
// tokens are one model's, alone. A new engine on one rank turns the graphs
// off (its old ones point at the old KV) until every rank has a new one,
// when all record afresh. With the dense MLPs split too, whose layers every
// rank, idle or not, takes part in; and with two ranks to a DP rank
// (attention TP), whose graphs hold the collectives of their DP group too.
void graphed_ranks_replay_decode_rounds(bool dense_tp, int attention_tp) {
  const std::string dir = kModels + "deepseek_v3";
  const RankGroupFactory recordable = [](std::span<Backend* const> backends) {
    std::vector<std::unique_ptr<Communicator>> out;
    for (auto& c : make_local_group(static_cast<int>(backends.size())))
      out.push_back(std::make_unique<testing::RecordableCommunicator>(std::move(c)));
    return out;
  };
  const int world = 2;  // DP ranks
  auto group = load_data_parallel(
      dir, world * attention_tp,
      [](int) { return std::make_unique<testing::ReplayingCpuBackend>(cpu::Bf16Activations::kF32, 1); }, {},
      std::chrono::microseconds(1000), Weights::kCheckpoint, recordable, DpMoe::kGather, GraphOptions{.max_batch = 8},
      dense_tp, attention_tp);
  ASSERT_EQ(group->world(), world);
  CpuBackend one_backend(&ThreadPool::global(), cpu::Bf16Activations::kF32);
  auto one = load_model(dir, one_backend);
  // Rank 0 gets 5 requests, rank 1 two: its rounds pad to rank 0's batch,
  // and once its requests end it sits idle while rank 0 decodes.
  std::mt19937 rng(5);
  std::vector<std::vector<EngineRequest>> requests(world);
  for (int r = 0; r < world; ++r)
    for (int i = 0; i < (r == 0 ? 5 : 2); ++i)
      requests[static_cast<size_t>(r)].push_back(
          testing::request(testing::random_ids(rng, 3 + static_cast<size_t>(i)), testing::greedy(r == 0 ? 9 : 4)));
  std::vector<std::unique_ptr<CpuBackend>> samplers;
  for (int r = 0; r < world; ++r) samplers.push_back(std::make_unique<CpuBackend>());
  std::vector<std::unique_ptr<Engine>> engines(world);
  const auto new_engine = [&](int r) {
    engines[static_cast<size_t>(r)].reset();  // the old engine first: its KV goes
    EngineOptions options;
    options.kv_slots = 256;
    engines[static_cast<size_t>(r)] = std::make_unique<Engine>(group->rank(r), *samplers[static_cast<size_t>(r)],
                                                               nullptr, options);
  };
  // Every rank serves its requests at once; each answer is one model's alone.
  const auto serve_and_check = [&](const std::string& when) {
    std::vector<std::vector<RequestOutput>> outputs(world);
    on_every_rank(world, [&](int r) {
      const auto i = static_cast<size_t>(r);
      outputs[i] = testing::run_all(*engines[i], requests[i]);
    });
    for (size_t r = 0; r < requests.size(); ++r)
      for (size_t i = 0; i < requests[r].size(); ++i) {
        GenerateOptions alone;
        alone.max_tokens = requests[r][i].params.max_tokens;
        alone.temperature = 0.0f;
        alone.ignore_eos = true;
        CpuBackend sampler;
        EXPECT_EQ(outputs[r][i].output_ids, generate(*one, sampler, requests[r][i].prompt, alone).output_ids)
            << when << ", rank " << r << " request " << i << ": " << outputs[r][i].error;
      }
  };
  for (int r = 0; r < world; ++r) new_engine(r);
  const GraphStats recorded0 = group->graph_stats(0), recorded1 = group->graph_stats(1);
  EXPECT_GT(recorded0.recordings, 0);  // the last engine's prepare recorded every rank's graphs
  EXPECT_EQ(recorded1.recordings, recorded0.recordings);
  serve_and_check("first engines");
  // Both ranks replayed decode rounds; rank 0 in more (rank 1 sat idle in
  // the rounds after its shorter requests ended, eagerly).
  const GraphStats served0 = group->graph_stats(0), served1 = group->graph_stats(1);
  EXPECT_GT(served1.replays, recorded1.replays);
  EXPECT_GT(served0.replays - recorded0.replays, served1.replays - recorded1.replays + 3);

  new_engine(0);  // rank 0 alone: eager until rank 1 has a new engine too
  serve_and_check("a new engine on rank 0");
  EXPECT_EQ(group->graph_stats(0).replays, served0.replays);
  EXPECT_EQ(group->graph_stats(1).replays, served1.replays);
  EXPECT_EQ(group->graph_stats(0).recordings, recorded0.recordings);

  new_engine(1);  // every rank new: recorded afresh, on both
  EXPECT_EQ(group->graph_stats(0).recordings, 2 * recorded0.recordings);
  EXPECT_EQ(group->graph_stats(1).recordings, 2 * recorded1.recordings);
  const GraphStats again0 = group->graph_stats(0);
  serve_and_check("new engines on every rank");
  EXPECT_GT(group->graph_stats(0).replays, again0.replays);
}

TEST(DataParallel, GraphedRanksReplayDecodeRoundsAndGiveOneModelsTokens) {
  for (const auto& [dense_tp, attention_tp] : {std::pair{false, 1}, std::pair{true, 1}, std::pair{true, 2}}) {
    SCOPED_TRACE(std::string(dense_tp ? "dense MLPs split" : "dense MLPs whole") + ", DP groups of " +
                 std::to_string(attention_tp));
    graphed_ranks_replay_decode_rounds(dense_tp, attention_tp);
  }
}

// With the other ranks known to be idle, a lone rank's step starts at once
// instead of after round_wait (2 s here).
TEST(DataParallel, ALoneBusyRankDoesNotWaitForIdleOnes) {
  auto group = load_data_parallel(kModels + "deepseek_v3", 2, [](int) { return make_cpu_backend_with_threads(1); },
                                  {}, std::chrono::seconds(2));
  Model& rank = group->rank(0);
  const int64_t vocab = rank.config().vocab_size;
  KvBuffers kv = rank.allocate_kv(8);
  Tensor logits = Tensor::empty({1, vocab}, DType::kF32);
  const std::vector<int32_t> ids = {3, 7, 11};
  auto seconds = [&] {
    const auto start = std::chrono::steady_clock::now();
    rank.forward(single_sequence_batch(ids, 0), kv, logits);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  EXPECT_GE(seconds(), 1.9) << "rank 1 was waited for";
  group->set_activity([](int r) { return r == 0; });
  EXPECT_LT(seconds(), 1.0);
  group->set_activity({});
  EXPECT_GE(seconds(), 1.9);
}

TEST(DataParallel, EachRankHoldsItsOwnLatentCacheAndMtpLayer) {
  auto group = load_over("deepseek_v3", 4);
  CpuBackend backend;
  auto one = load_model(kModels + "deepseek_v3", backend);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(group->rank(r).kv_bytes_per_slot(DType::kF32), one->kv_bytes_per_slot(DType::kF32));
    ASSERT_NE(group->rank(r).draft_head(), nullptr);
    EXPECT_EQ(group->rank(r).draft_head()->kv_bytes_per_slot(DType::kF32),
              one->draft_head()->kv_bytes_per_slot(DType::kF32));
  }
  EXPECT_NE(group->rank(2).summary().find("DP attention over 4 ranks (this is rank 2), experts by the exchange"),
            std::string::npos)
      << group->rank(2).summary();
  EXPECT_NE(load_over("deepseek_v3", 2, DpMoe::kGather)->rank(1).summary().find("experts by gathering"),
            std::string::npos);
  EXPECT_NE(group->rank(2).summary().find("dense MLPs and shared experts whole on each rank"), std::string::npos);
  EXPECT_NE(load_over("deepseek_v3", 2, DpMoe::kGather, true)
                ->rank(1)
                .summary()
                .find("experts by gathering, dense MLPs and shared experts split over the 2 ranks"),
            std::string::npos);
  // DP groups of 2: a DP rank's KV is each of its ranks' latent cache.
  auto groups = load_over("deepseek_v3", 4, DpMoe::kExchange, false, 2);
  ASSERT_EQ(groups->world(), 2);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(groups->rank(d).kv_bytes_per_slot(DType::kF32), 2 * one->kv_bytes_per_slot(DType::kF32));
    EXPECT_EQ(groups->rank(d).draft_head()->kv_bytes_per_slot(DType::kF32),
              2 * one->draft_head()->kv_bytes_per_slot(DType::kF32));
    EXPECT_EQ(groups->rank(d).allocate_kv(8).k.size(), 2 * static_cast<size_t>(one->config().num_layers));
  }
  EXPECT_NE(groups->rank(1).summary().find("DP attention over 2 ranks (this is rank 1, its attention heads over 2 "
                                           "ranks), experts by the exchange, dense MLPs and shared experts split "
                                           "over its 2 ranks"),
            std::string::npos)
      << groups->rank(1).summary();
}

// The MTP layer over DP-attention ranks, against transformers' MTP logits:
// every rank at once, rank r first running r more steps of the model, so
// that steps and passes of the MTP layer are handed in together and meet in
// rounds of their own kind; then one rank alone, the others idle in its
// passes; then the passes position by position.
TEST(DataParallel, MtpHeadOnEachRankMatchesTransformers) {
  const std::string dir = kModels + "deepseek_v3";
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/reference.safetensors");
  const Tensor ids = ref.tensor("mtp.ids"), next = ref.tensor("mtp.next_ids"), want = ref.tensor("mtp.logits");
  const int64_t n = ids.numel();
  struct Layout {
    int ranks;
    DpMoe moe;
    bool dense_tp;
    int attention_tp = 1;
  };
  for (const auto& [ranks, moe, dense_tp, attention_tp] :
       {Layout{2, DpMoe::kExchange, false}, Layout{4, DpMoe::kExchange, false}, Layout{2, DpMoe::kGather, false},
        Layout{4, DpMoe::kGather, false}, Layout{2, DpMoe::kGather, true}, Layout{4, DpMoe::kGather, true},
        Layout{4, DpMoe::kExchange, false, 2}, Layout{4, DpMoe::kGather, true, 2}}) {
    SCOPED_TRACE("over " + std::to_string(ranks) + " ranks" + (moe == DpMoe::kGather ? ", by gathering" : "") +
                 (dense_tp ? ", dense MLPs split" : "") + ", DP groups of " + std::to_string(attention_tp));
    auto group = load_over("deepseek_v3", ranks, moe, dense_tp, attention_tp);
    const int world = group->world();
    const int64_t H = group->rank(0).config().hidden_size, V = group->rank(0).config().vocab_size;
    const auto run_rank = [&](int r, int extra_steps) {
      Model& model = group->rank(r);
      DraftHead& head = *model.draft_head();
      Tensor logits = Tensor::empty({n, V}, DType::kF32), hidden = Tensor::empty({n, H}, DType::kF32);
      for (int i = 0; i <= extra_steps; ++i) {
        KvBuffers kv = model.allocate_kv(n);
        model.forward(single_sequence_batch(testing::ids_of(ids), 0, true), kv, logits, &hidden);
      }
      KvBuffers head_kv = head.allocate_kv(n);
      Tensor head_logits = Tensor::empty({n, V}, DType::kF32);
      head.forward(single_sequence_batch(testing::ids_of(next), 0, true), hidden, head_kv, head_logits);
      EXPECT_LT(testing::relative_error(head_logits, want), 1e-4) << "rank " << r;
      return hidden;
    };
    on_every_rank(world, [&](int r) { run_rank(r, r); });
    const Tensor hidden = run_rank(world - 1, 0);
    DraftHead& head = *group->rank(world - 1).draft_head();
    KvBuffers step_kv = head.allocate_kv(n);
    Tensor step_logits = Tensor::empty({1, V}, DType::kF32);
    for (int64_t i = 0; i < n; ++i) {
      head.forward(single_sequence_batch(testing::ids_of(next).subspan(static_cast<size_t>(i), 1), i),
                   hidden.rows(i, 1), step_kv, step_logits);
      EXPECT_LT(testing::relative_error(step_logits, want.rows(i, 1)), 1e-4) << "position " << i;
    }
    // A wrong output fails alone, before the round.
    Tensor wrong = Tensor::empty({n, V + 1}, DType::kF32);
    EXPECT_THROW(head.forward(single_sequence_batch(testing::ids_of(next), 0, true), hidden, step_kv, wrong), Error);
  }
}

TEST(DataParallel, ALayoutItCannotRunIsRefusedNamingWhy) {
  try {
    load_over("deepseek_v2_lite", 3);  // 8 experts
    FAIL() << "8 experts over 3 ranks loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_routed_experts (8)"), std::string::npos) << e.what();
  }
  try {
    load_over("llama", 2);
    FAIL() << "a dense model loaded with DP attention";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DP attention is for DeepSeek"), std::string::npos) << e.what();
  }
  try {
    load_over("deepseek_v3", 2, DpMoe::kExchange, true);
    FAIL() << "dense MLPs split over the ranks with the exchange loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("need the experts reached by gathering"), std::string::npos) << e.what();
  }
  try {
    load_over("deepseek_v3", 4, DpMoe::kExchange, false, 3);
    FAIL() << "4 ranks in DP groups of 3 loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 ranks do not make DP groups of 3"), std::string::npos) << e.what();
  }
  try {
    load_over("deepseek_v3", 8, DpMoe::kExchange, false, 8);  // 4 heads
    FAIL() << "4 heads split over 8 ranks loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_attention_heads"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace basalt

#include "model/model.h"

#include <algorithm>
#include <cstdlib>
#include <future>
#include <string>
#include <vector>

#include "backend/communicator.h"
#include "core/error.h"
#include "core/startup.h"
#include "model/checkpoint.h"
#include "model/deepseek_v3.h"
#include "model/dense.h"

namespace basalt {
namespace {

// The layer index of "model.layers.<i>.<rest>", or -1.
int64_t layer_of(const std::string& name) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (name.rfind(kPrefix, 0) != 0) return -1;
  const char* digits = name.c_str() + kPrefix.size();
  char* end = nullptr;
  const long long i = std::strtoll(digits, &end, 10);
  return end != digits && *end == '.' ? i : -1;
}

// Tensors a checkpoint may carry that Basalt knowingly does not read, as
// transformers does not: rotary inverse-frequency buffers (computed from the
// config), a stored lm_head of a model with tied embeddings (the embedding is
// the head), and DeepSeek MTP layers after the first (Basalt's draft uses
// one, as DeepSeek-V3 ships one).
bool known_unused(const std::string& name, const ModelConfig& config) {
  if (name.find("rotary_emb.inv_freq") != std::string::npos) return true;
  if (name == "lm_head.weight" && config.tie_word_embeddings) return true;
  const int64_t layer = layer_of(name);
  const int64_t mtp_layers = config.deepseek.num_nextn_predict_layers;
  if (layer > config.num_layers && layer < config.num_layers + mtp_layers) return true;
  return false;
}

// A config that disagrees with its checkpoint (fewer layers than stored, a
// layer count that turns the MTP layer into a decoder layer, a missing
// num_nextn_predict_layers) would load a different model without a word:
// every tensor must have been read or be known-unused.
void check_every_tensor_used(const ModelConfig& config, const Checkpoint& checkpoint) {
  std::vector<std::string> unused;
  int64_t highest_layer = -1;
  for (const std::string& name : checkpoint.unused()) {
    if (known_unused(name, config)) continue;
    unused.push_back(name);
    highest_layer = std::max(highest_layer, layer_of(name));
  }
  if (unused.empty()) return;
  std::string examples;
  for (size_t i = 0; i < std::min<size_t>(unused.size(), 3); ++i)
    examples += (i ? ", '" : "'") + unused[i] + "'";
  std::string hint;
  const int64_t mtp = config.deepseek.num_nextn_predict_layers;
  if (highest_layer >= config.num_layers)
    hint = fmt::format("; the checkpoint has layers up to {} but config.json's num_hidden_layers is {}{}",
                       highest_layer, config.num_layers,
                       mtp > 0 || config.architecture == Architecture::kDeepseekV2 ||
                               config.architecture == Architecture::kDeepseekV3
                           ? fmt::format(" and num_nextn_predict_layers {}", mtp)
                           : std::string());
  else if (highest_layer >= 0)
    hint = "; does config.json describe these layers (e.g. MoE, biases, q/k norms)?";
  fail("{}: {} checkpoint tensor{} not used by the model config.json describes ({}{}){}", checkpoint.dir(),
       unused.size(), unused.size() == 1 ? " is" : "s are", examples, unused.size() > 3 ? ", ..." : "", hint);
}

}  // namespace

std::unique_ptr<Model> load_model(const std::string& dir, Backend& backend,
                                  const LoadProgress& progress, const RankRole& role, Weights weights) {
  const ModelConfig config = ModelConfig::load(dir);
  BASALT_CHECK(!config.eagle_head,
               "{}: this is an EAGLE draft head, not a model (use it with --speculative-algorithm eagle "
               "--speculative-draft-model DIR)", dir);
  const bool deepseek =
      config.architecture == Architecture::kDeepseekV2 || config.architecture == Architecture::kDeepseekV3;
  Checkpoint checkpoint =
      weights == Weights::kRandom
          ? Checkpoint::random({.fp8_linears = config.deepseek.fp8_block_weights,
                                .tied_lm_head = config.tie_word_embeddings,
                                .router_bias = deepseek && config.deepseek.topk_method == "noaux_tc",
                                .num_layers = config.num_layers},
                               dir)
          : Checkpoint::open(dir);
  mark_startup_phase("mmap");
  BASALT_CHECK(deepseek || !role.dp_attention,
               "{}: DP attention is for DeepSeek's latent attention; a {} model runs tensor-parallel", dir,
               config.model_type);
  // The pages are read ahead on a thread of their own while the loader
  // copies (to the GPU; on the CPU, a dense model's fused projections), so
  // that reading from disk and copying overlap rather than add up: the
  // copies find their pages read, or at least requested in large sequential
  // reads instead of one page fault at a time. Not for a DeepSeek model on
  // the CPU, which copies nothing: only the pages a forward pass touches
  // become resident (the MTP layer and idle experts cost nothing). Of a
  // group's ranks, a dense model's rank that reports progress (rank 0)
  // reads, so the ranks do not each read the whole checkpoint; a DeepSeek
  // rank of a group holds a share of the experts, and none reads ahead.
  const bool copies_everything = !deepseek || backend.device() != Device::kCpu;
  std::future<void> read_ahead;
  if (copies_everything && (role.group == nullptr || (progress && !deepseek)))
    read_ahead = std::async(std::launch::async, [&checkpoint, &progress] {
      checkpoint.prefetch(progress);
      mark_startup_phase("read");
    });
  // (If the load throws, the future's destructor waits for the thread.)
  std::unique_ptr<Model> model = deepseek ? load_deepseek_model(config, checkpoint, backend, role)
                                          : load_dense_model(config, checkpoint, backend, role.group);
  if (read_ahead.valid()) read_ahead.get();
  BASALT_CHECK(model != nullptr, "{}: unsupported architecture", dir);
  check_every_tensor_used(config, checkpoint);
  mark_startup_phase("upload");
  return model;
}

}  // namespace basalt

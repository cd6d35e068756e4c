// Test helpers: a model's prefill logits and greedy continuation against a
// transformers fixture.
//
// A fixture's reference.safetensors holds prompt_<p>.ids and their
// full-sequence prompt_<p>.logits (reference.json lists "prompt_lengths").
// Its reference.json holds "greedy_prompt", "greedy_output" and the
// reference's top-2 "greedy_margins". Tokens are compared one for one until
// the reference itself was a near-tie (margin < 1e-4): past that point float
// noise may legitimately pick the other token.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "runtime/generator.h"

namespace basalt::testing {

// The ids of a host i32 tensor, as a span.
inline std::span<const int32_t> ids_of(const Tensor& t) {
  return {t.data<const int32_t>(), static_cast<size_t>(t.numel())};
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// Every fixture prompt prefilled at once with every row's logits: relative
// RMS error under max_relative (1e-5: the dense families in f32 on the host)
// and no logit off by more than max_abs. `label` names the case in failures.
inline void expect_prefill_logits_match_reference(Model& model, const std::string& fixture_dir,
                                                  const std::string& label, double max_relative = 1e-5,
                                                  double max_abs_diff = 1e-3) {
  const SafetensorsFile ref = SafetensorsFile::open(fixture_dir + "/reference.safetensors");
  const nlohmann::json meta = read_json(fixture_dir + "/reference.json");
  const int64_t vocab = model.config().vocab_size;
  for (size_t p = 0; p < meta["prompt_lengths"].size(); ++p) {
    const Tensor ids = ref.tensor("prompt_" + std::to_string(p) + ".ids");
    const Tensor expected = ref.tensor("prompt_" + std::to_string(p) + ".logits");
    const int64_t n = ids.numel();
    ForwardBatch batch = single_sequence_batch(
        std::span<const int32_t>(ids.data<int32_t>(), static_cast<size_t>(n)), 0, /*all_logits=*/true);
    KvBuffers kv = model.allocate_kv(n);
    Tensor logits = Tensor::empty({n, vocab}, DType::kF32);
    model.forward(batch, kv, logits);
    double diff2 = 0, ref2 = 0, max_abs = 0;
    for (int64_t i = 0; i < n * vocab; ++i) {
      const double d = logits.data<float>()[i] - expected.data<float>()[i];
      diff2 += d * d;
      ref2 += static_cast<double>(expected.data<float>()[i]) * expected.data<float>()[i];
      max_abs = std::max(max_abs, std::fabs(d));
    }
    EXPECT_LT(std::sqrt(diff2 / ref2), max_relative) << label << ", prompt length " << n;
    EXPECT_LT(max_abs, max_abs_diff) << label << ", prompt length " << n;
  }
}

// min_margin: compare until the reference's top-2 margin falls below it
// (1e-4 for f32 backends; larger where activations are rounded to 16 bits).
inline void expect_greedy_matches_reference(Model& model, Backend& backend, const std::string& fixture_dir,
                                            double min_margin = 1e-4, size_t min_compared = 8) {
  const nlohmann::json meta = read_json(fixture_dir + "/reference.json");
  const std::vector<int32_t> prompt = meta["greedy_prompt"].get<std::vector<int32_t>>();
  const std::vector<int32_t> expected = meta["greedy_output"].get<std::vector<int32_t>>();
  const std::vector<double> margins = meta["greedy_margins"].get<std::vector<double>>();
  GenerateOptions options;
  options.max_tokens = static_cast<int>(expected.size());
  options.temperature = 0.0f;
  options.ignore_eos = true;
  const GenerateResult result = generate(model, backend, prompt, options);
  ASSERT_EQ(result.output_ids.size(), expected.size());
  size_t compared = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (margins[i] < min_margin) break;
    EXPECT_EQ(result.output_ids[i], expected[i]) << fixture_dir << " step " << i;
    ++compared;
  }
  EXPECT_GE(compared, min_compared) << "too few comparable steps in the fixture";
}

}  // namespace basalt::testing

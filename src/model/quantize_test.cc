// Block-FP8 quantization: the exact properties of the format on synthetic
// weights (partial blocks, zero blocks, subnormals), and quantized copies of
// the DeepSeek fixtures loaded by the engine next to their bf16 originals.
#include "model/quantize.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "model/safetensors.h"

namespace basalt {
namespace {

namespace fs = std::filesystem;
const std::string kModels = std::string(BASALT_TESTDATA) + "/models/";

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// A fresh, absent directory under the system temporary directory.
fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() /
                       ("basalt_quantize_test_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  return dir;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// |w - dequantized| for one element: half an e4m3 ulp of w / s, scaled back,
// plus float32 rounding of the division and the product.
double error_bound(float w, float s) {
  const double aw = std::fabs(static_cast<double>(w));
  return std::max(aw * 0x1p-4, static_cast<double>(s) * 0x1p-10) * (1 + 0x1p-10) + aw * 0x1p-20;
}

// Checks every exact property of a quantized weight against its original.
void expect_block_fp8_of(const Tensor& original, const Tensor& q, const Tensor& scale_inv,
                         const std::string& what) {
  const int64_t rows = original.dim(0), cols = original.dim(1);
  const int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
  ASSERT_EQ(q.dtype(), DType::kF8E4M3) << what;
  ASSERT_EQ(q.shape(), original.shape()) << what;
  ASSERT_EQ(scale_inv.dtype(), DType::kF32) << what;
  ASSERT_EQ(scale_inv.shape(), Shape({br, bc})) << what;
  const Tensor w = original.to_f32();
  const Tensor deq = dequantize_fp8_block(q, scale_inv);
  const uint8_t* qb = static_cast<const uint8_t*>(q.raw());
  std::vector<float> amax(static_cast<size_t>(br * bc), 0.0f);
  std::vector<bool> hits_max(static_cast<size_t>(br * bc), false);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const size_t b = static_cast<size_t>((r / 128) * bc + c / 128);
      const float v = w.data<float>()[r * cols + c];
      amax[b] = std::max(amax[b], std::fabs(v));
      const uint8_t bits = qb[r * cols + c];
      if ((bits & 0x7f) == 0x7e) hits_max[b] = true;  // +-448
      ASSERT_NE(bits & 0x7f, 0x7f) << what << ": NaN at [" << r << ", " << c << "]";
      const float s = scale_inv.data<float>()[b];
      ASSERT_LE(std::fabs(static_cast<double>(v) - deq.data<float>()[r * cols + c]), error_bound(v, s))
          << what << " [" << r << ", " << c << "]: " << v << " vs " << deq.data<float>()[r * cols + c];
    }
  }
  for (size_t b = 0; b < amax.size(); ++b) {
    if (amax[b] == 0.0f) {
      EXPECT_EQ(scale_inv.data<float>()[b], 1.0f) << what << " block " << b;
    } else {
      EXPECT_EQ(scale_inv.data<float>()[b], amax[b] / 448.0f) << what << " block " << b;
      EXPECT_TRUE(hits_max[b]) << what << ": block " << b << " does not reach 448";
    }
  }
}

TEST(Fp8Block, PartialBlocksZeroBlocksAndSubnormalsStayWithinHalfAnUlp) {
  // [300, 200]: 3 x 2 blocks, the last row and column of blocks partial.
  const int64_t rows = 300, cols = 200;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float v = normal(rng);
      if (r < 128 && c >= 128) v = 0.0f;                     // an all-zero (partial) block
      if (r >= 256 && c < 128) v *= (c % 2 == 0) ? 1e-4f : 1.0f;  // many subnormal quotients
      if (r == 5 && c == 7) v = 3.0f;                        // one outlier dominates block (0, 0)
      values[static_cast<size_t>(r * cols + c)] = v;
    }
  }
  const Tensor f32 = Tensor::from_f32({rows, cols}, values);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor w = Tensor::empty({rows, cols}, dtype);
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float v = values[static_cast<size_t>(i)];
      if (dtype == DType::kF32) w.data<float>()[i] = v;
      if (dtype == DType::kBF16) static_cast<uint16_t*>(w.raw())[i] = f32_to_bf16(v);
      if (dtype == DType::kF16) static_cast<uint16_t*>(w.raw())[i] = f32_to_f16(v);
    }
    const Fp8BlockWeight q = quantize_fp8_block(w);
    expect_block_fp8_of(w, q.weight, q.scale_inv, std::string(dtype_name(dtype)));
  }

  // The bound is attained up to a factor of two: the largest relative
  // error among normal values is above 2^-5.
  const Fp8BlockWeight q = quantize_fp8_block(f32);
  const Tensor deq = dequantize_fp8_block(q.weight, q.scale_inv);
  double worst = 0;
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float v = values[static_cast<size_t>(i)];
    const int64_t r = i / cols, c = i % cols;
    const float s = q.scale_inv.data<float>()[(r / 128) * 2 + c / 128];
    if (std::fabs(v) / s >= 0x1p-6f)
      worst = std::max(worst, std::fabs(static_cast<double>(v) - deq.data<float>()[i]) / std::fabs(v));
  }
  EXPECT_GT(worst, 0x1p-5);
  EXPECT_LE(worst, 0x1p-4 * (1 + 0x1p-10));
}

TEST(Fp8Block, RejectsNonFiniteWeights) {
  std::vector<float> values(64, 0.5f);
  values[33] = std::nanf("");
  const std::string message = error_of([&] { fp8_block_scales(Tensor::from_f32({8, 8}, values), "w"); });
  EXPECT_NE(message.find("w: element [4, 1]"), std::string::npos) << message;
  values[33] = INFINITY;
  EXPECT_NE(error_of([&] { fp8_block_scales(Tensor::from_f32({8, 8}, values)); }), "");
}

TEST(Fp8Block, QuantizesExactlyTheDecoderLinears) {
  const Shape m = {4, 4};
  for (const char* name :
       {"model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.q_b_proj.weight",
        "model.layers.12.self_attn.q_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.0.self_attn.kv_b_proj.weight", "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight", "model.layers.3.mlp.experts.255.down_proj.weight",
        "model.layers.3.mlp.shared_experts.gate_proj.weight"})
    EXPECT_TRUE(is_fp8_block_linear(name, m)) << name;
  for (const char* name :
       {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
        "model.layers.3.mlp.gate.weight", "model.layers.3.mlp.gate.e_score_correction_bias",
        "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.kv_a_layernorm.weight",
        "model.layers.61.embed_tokens.weight", "model.layers.61.shared_head.head.weight",
        "model.layers.61.enorm.weight", "model.layers.61.eh_proj.weight",
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.x.self_attn.q_proj.weight", "model.q_proj.weight"})
    EXPECT_FALSE(is_fp8_block_linear(name, m)) << name;
  EXPECT_FALSE(is_fp8_block_linear("model.layers.0.mlp.down_proj.weight", {4}));
  EXPECT_FALSE(is_fp8_block_linear("model.layers.0.mlp.experts.down_proj.weight", {2, 4, 4}));
}

// Full-sequence logits of a prompt in one step.
Tensor prefill_logits(Model& model, std::span<const int32_t> ids) {
  const int64_t n = static_cast<int64_t>(ids.size());
  KvBuffers kv = model.allocate_kv(n);
  Tensor logits = Tensor::empty({n, model.config().vocab_size}, DType::kF32);
  model.forward(single_sequence_batch(ids, 0, /*all_logits=*/true), kv, logits);
  return logits;
}

std::vector<double> log_softmax(const float* row, int64_t n) {
  double max = row[0];
  for (int64_t i = 1; i < n; ++i) max = std::max(max, static_cast<double>(row[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(row[i] - max);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = row[i] - max - std::log(sum);
  return out;
}

// A plain f32 checkpoint with the quantized copy's weights dequantized: what
// the engine must compute for the FP8 copy, up to summation order.
fs::path write_dequantized(const Checkpoint& quantized, const std::string& name) {
  const fs::path dir = temp_dir(name);
  fs::create_directories(dir);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& t : quantized.names()) {
    if (t.size() > 10 && t.compare(t.size() - 10, 10, "_scale_inv") == 0) continue;
    const Tensor w = quantized.get(t);
    tensors.emplace_back(t, w.dtype() == DType::kF8E4M3
                                ? dequantize_fp8_block(w, quantized.get(t + "_scale_inv"))
                                : w);
  }
  write_safetensors((dir / "model.safetensors").string(), tensors);
  nlohmann::json config = read_json(fs::path(quantized.dir()) / "config.json");
  config.erase("quantization_config");
  std::ofstream(dir / "config.json") << config.dump();
  fs::copy_file(fs::path(quantized.dir()) / "generation_config.json", dir / "generation_config.json");
  return dir;
}

struct LogitsDistance {
  double relative_error = 0;  // ||a - b|| / ||b|| over all positions
  double mean_kl = 0;         // mean over positions of KL(softmax(b) || softmax(a))
  int64_t same_argmax = 0;    // positions whose largest logit is the same token
  std::vector<double> position_errors;  // ||a_t - b_t|| / ||b_t||, sorted
};

LogitsDistance distance(const Tensor& a, const Tensor& b) {
  const int64_t n = b.dim(0), vocab = b.dim(1);
  double diff2 = 0, ref2 = 0, kl_sum = 0;
  LogitsDistance d;
  for (int64_t t = 0; t < n; ++t) {
    const float* r = b.data<float>() + t * vocab;
    const float* g = a.data<float>() + t * vocab;
    const std::vector<double> lp = log_softmax(r, vocab), lq = log_softmax(g, vocab);
    double row_diff2 = 0, row_ref2 = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      const size_t i = static_cast<size_t>(v);
      row_diff2 += (static_cast<double>(r[v]) - g[v]) * (static_cast<double>(r[v]) - g[v]);
      row_ref2 += static_cast<double>(r[v]) * r[v];
      kl_sum += std::exp(lp[i]) * (lp[i] - lq[i]);
    }
    diff2 += row_diff2;
    ref2 += row_ref2;
    d.position_errors.push_back(std::sqrt(row_diff2 / row_ref2));
    d.same_argmax += std::max_element(r, r + vocab) - r == std::max_element(g, g + vocab) - g;
  }
  std::sort(d.position_errors.begin(), d.position_errors.end());
  d.relative_error = std::sqrt(diff2 / ref2);
  d.mean_kl = kl_sum / static_cast<double>(n);
  return d;
}

class QuantizeDeepseek : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantizeDeepseek, CopyHasThePublishedLayoutAndRunsCloseToTheOriginal) {
  const std::string in = kModels + GetParam();
  const fs::path out = temp_dir(GetParam());
  const QuantizeReport report = quantize_checkpoint(in, out.string());

  // Layout: same shard files, index when the input had one, config gains
  // the quantization_config, tokenizer and generation config copied.
  const Checkpoint original = Checkpoint::open(in);
  const Checkpoint quantized = Checkpoint::open(out.string());
  ASSERT_EQ(report.files.size(), original.files().size());
  EXPECT_EQ(fs::exists(out / "model.safetensors.index.json"),
            fs::exists(fs::path(in) / "model.safetensors.index.json"));
  const nlohmann::json config = read_json(out / "config.json");
  EXPECT_EQ(config["quantization_config"],
            nlohmann::json::parse(R"({"activation_scheme": "dynamic", "fmt": "e4m3",
                                      "quant_method": "fp8", "weight_block_size": [128, 128]})"));
  nlohmann::json without = config;
  without.erase("quantization_config");
  EXPECT_EQ(without, read_json(fs::path(in) / "config.json"));
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    EXPECT_TRUE(fs::exists(out / file)) << file;

  // Every tensor: decoder linears quantized with exact block properties,
  // everything else byte-identical and in the same shard.
  int64_t linears = 0;
  for (const std::string& name : original.names()) {
    const CheckpointTensorInfo info = original.info(name);
    ASSERT_TRUE(quantized.has(name)) << name;
    EXPECT_EQ(fs::path(quantized.info(name).file).filename(), fs::path(info.file).filename()) << name;
    const Tensor a = original.get(name), b = quantized.get(name);
    if (is_fp8_block_linear(name, info.shape)) {
      ++linears;
      ASSERT_TRUE(quantized.has(name + "_scale_inv")) << name;
      expect_block_fp8_of(a, b, quantized.get(name + "_scale_inv"), name);
    } else {
      ASSERT_EQ(b.dtype(), a.dtype()) << name;
      ASSERT_EQ(b.shape(), a.shape()) << name;
      EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << name;
      EXPECT_FALSE(quantized.has(name + "_scale_inv")) << name;
    }
  }
  EXPECT_EQ(report.tensors_quantized, linears);
  EXPECT_EQ(report.tensors_copied, static_cast<int64_t>(original.names().size()) - linears);
  EXPECT_EQ(quantized.names().size(), original.names().size() + static_cast<size_t>(linears));
  EXPECT_EQ(report.bytes_before, original.total_bytes());
  EXPECT_EQ(report.bytes_after, quantized.total_bytes());
  EXPECT_LT(report.bytes_after, report.bytes_before);
  EXPECT_TRUE(quantized.has("model.layers.1.mlp.gate.weight"));
  EXPECT_EQ(quantized.info("model.layers.1.mlp.gate.weight").dtype,
            original.info("model.layers.1.mlp.gate.weight").dtype);

  // The engine loads the copy; its logits stay close to the original's.
  CpuBackend backend;
  auto bf16 = load_model(in, backend);
  auto fp8 = load_model(out.string(), backend);
  EXPECT_NE(fp8->summary().find("fp8 e4m3"), std::string::npos) << fp8->summary();
  const std::vector<int> prompt = read_json(fs::path(in) / "reference.json")["greedy_prompt"];
  std::vector<int32_t> ids(prompt.begin(), prompt.end());
  for (int32_t i = 0; i < 24; ++i) ids.push_back((i * 37 + 11) % 300);
  const Tensor ref = prefill_logits(*bf16, ids);
  const Tensor got = prefill_logits(*fp8, ids);
  const int64_t n = static_cast<int64_t>(ids.size());

  // Exactly the dequantized weights' function: the loader reads the scales
  // as the quantizer wrote them.
  const fs::path deq_dir = write_dequantized(quantized, GetParam() + "_dequantized");
  auto deq = load_model(deq_dir.string(), backend);
  const LogitsDistance exact = distance(got, prefill_logits(*deq, ids));
  EXPECT_LT(exact.relative_error, 1e-5);
  EXPECT_EQ(exact.same_argmax, n);
  fs::remove_all(deq_dir);

  // Against the bf16 original. Each linear's weights move by up to 2^-4
  // relative (about 2% RMS), which moves most positions' logits by 5-10% on
  // these random-weight models; at a few positions the perturbed hidden
  // state flips the sigmoid router's group-limited top-k, a discontinuity
  // that moves those logits by up to about 60%. So: the typical position is
  // within 0.1 and most within 0.15, the softmaxes stay close in KL, and the
  // greedy token mostly survives (random models have margins under 0.01).
  const LogitsDistance d = distance(got, ref);
  const double median = d.position_errors[d.position_errors.size() / 2];
  const auto within = std::count_if(d.position_errors.begin(), d.position_errors.end(),
                                    [](double e) { return e < 0.15; });
  std::printf("%s: logits relative error %.4g (median position %.4g, %lld/%lld positions under "
              "0.15), mean KL %.4g, same argmax %lld/%lld\n",
              GetParam().c_str(), d.relative_error, median, static_cast<long long>(within),
              static_cast<long long>(n), d.mean_kl, static_cast<long long>(d.same_argmax),
              static_cast<long long>(n));
  EXPECT_LT(median, 0.1);
  EXPECT_GE(within * 4, n * 3);
  EXPECT_LT(d.relative_error, 0.3);
  EXPECT_LT(d.mean_kl, 0.05);
  EXPECT_GE(d.same_argmax * 10, n * 7);
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantizeDeepseek,
                         ::testing::Values("deepseek_v3", "deepseek_v2_lite"));

// The integer formats over a dense model with tied embeddings (qwen2: q/k/v
// biases), one without (llama), and DeepSeek-V3 (experts, MLA, MTP).
struct IntCase {
  std::string model;
  QuantFormat format;
  int64_t group;
};

void PrintTo(const IntCase& c, std::ostream* os) {
  *os << c.model << (c.format == QuantFormat::kInt8 ? " int8 " : " int4 ") << c.group;
}

class QuantizeInt : public ::testing::TestWithParam<IntCase> {};

TEST_P(QuantizeInt, CopyHoldsTheFormatAndRunsCloseToTheOriginal) {
  const IntCase& p = GetParam();
  const std::string in = kModels + p.model;
  const fs::path out = temp_dir(p.model + "_int");
  QuantizeOptions options;
  options.format = p.format;
  options.group_size = p.group;
  const QuantizeReport report = quantize_checkpoint(in, out.string(), options);
  const int bits = p.format == QuantFormat::kInt8 ? 8 : 4;

  const Checkpoint original = Checkpoint::open(in);
  const Checkpoint quantized = Checkpoint::open(out.string());
  const ModelConfig config = ModelConfig::load(in);
  const nlohmann::json json = read_json(out / "config.json");
  EXPECT_EQ(json["quantization_config"],
            nlohmann::json({{"quant_method", "basalt-int"}, {"bits", bits}, {"group_size", p.group}}));
  EXPECT_FALSE(json.value("tie_word_embeddings", false));
  const bool deepseek = config.architecture == Architecture::kDeepseekV3;

  // Every linear the format covers holds the codes and scales of its rows
  // (checked against the format's own row quantizer); the rest is copied.
  std::vector<std::string> names = original.names();
  if (config.tie_word_embeddings) names.push_back("lm_head.weight");
  int64_t linears = 0;
  for (const std::string& name : names) {
    const bool tied_head = name == "lm_head.weight" && config.tie_word_embeddings;
    const Tensor a = original.get(tied_head ? "model.embed_tokens.weight" : name);
    ASSERT_TRUE(quantized.has(name)) << name;
    const Tensor b = quantized.get(name);
    if (!is_int_linear(name, a.shape(), config)) {
      ASSERT_EQ(b.dtype(), a.dtype()) << name;
      EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << name;
      EXPECT_FALSE(quantized.has(name + "_scale")) << name;
      continue;
    }
    ++linears;
    EXPECT_TRUE(name.find("kv_b_proj") == std::string::npos) << name;
    const IntWeightLayout l{bits, p.group < 0 ? a.dim(1) : p.group, a.dim(1)};
    const LinearWeight w = read_int_linear(quantized, name, a.dim(0), a.dim(1), ModelConfig::load(out.string()));
    const Tensor f = a.to_f32();
    std::vector<uint8_t> codes(static_cast<size_t>(l.code_columns()));
    std::vector<uint16_t> scales(static_cast<size_t>(l.scale_columns()));
    for (int64_t r = 0; r < a.dim(0); ++r) {
      quantize_int_row(l, f.data<const float>() + r * a.dim(1), codes.data(), scales.data());
      ASSERT_EQ(std::memcmp(codes.data(), w.weight.data<const uint8_t>() + r * l.code_columns(), codes.size()), 0)
          << name << " row " << r;
      ASSERT_EQ(std::memcmp(scales.data(), w.scales.data<const uint16_t>() + r * l.scale_columns(),
                            scales.size() * 2),
                0)
          << name << " row " << r;
    }
  }
  EXPECT_GT(linears, 0);
  EXPECT_EQ(report.tensors_quantized, linears);
  EXPECT_EQ(quantized.has("lm_head.weight_scale"), !deepseek);
  EXPECT_LT(report.bytes_after, report.bytes_before + (config.tie_word_embeddings ? original.get(
                                                          "model.embed_tokens.weight").nbytes() : 0));

  // The engine runs the copy (integer kernels) close to the original.
  CpuBackend backend;
  auto plain = load_model(in, backend);
  auto ints = load_model(out.string(), backend);
  const std::vector<int> prompt = read_json(fs::path(in) / "reference.json")["greedy_prompt"];
  std::vector<int32_t> ids(prompt.begin(), prompt.end());
  for (int32_t i = 0; i < 24; ++i) ids.push_back((i * 37 + 11) % 300);
  const int64_t n = static_cast<int64_t>(ids.size());
  const LogitsDistance d = distance(prefill_logits(*ints, ids), prefill_logits(*plain, ids));
  const double median = d.position_errors[d.position_errors.size() / 2];
  std::printf("%s int%d group %lld: logits relative error %.4g (median position %.4g), mean KL %.4g, "
              "same argmax %lld/%lld\n",
              p.model.c_str(), bits, static_cast<long long>(p.group), d.relative_error, median, d.mean_kl,
              static_cast<long long>(d.same_argmax), static_cast<long long>(n));
  // int8 moves each weight by at most half of 1/127 of its group's largest
  // (int4: 1/8 of it) and each activation likewise; these random models
  // amplify that less than FP8's 2^-4 (DeepSeek's router flips a few
  // positions, as with FP8 above).
  EXPECT_LT(median, bits == 8 ? 0.05 : 0.3);
  EXPECT_LT(d.mean_kl, bits == 8 ? 0.01 : 0.1);
  EXPECT_GE(d.same_argmax * 10, n * (bits == 8 ? 8 : 5));
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantizeInt,
                         ::testing::Values(IntCase{"llama", QuantFormat::kInt8, 32},
                                           IntCase{"qwen2", QuantFormat::kInt4, 32},
                                           IntCase{"qwen2", QuantFormat::kInt8, -1},
                                           IntCase{"deepseek_v3", QuantFormat::kInt8, 64},
                                           IntCase{"deepseek_v3", QuantFormat::kInt4, 32}));

TEST(QuantizeCheckpoint, RefusesBadInputsWithOneClearError) {
  const fs::path out = temp_dir("errors");
  auto quantize = [&](const std::string& in, bool force = false) {
    return error_of([&] { quantize_checkpoint(in, out.string(), QuantizeOptions{force}); });
  };
  EXPECT_NE(quantize(kModels + "deepseek_v3_fp8").find("already quantized"), std::string::npos);
  EXPECT_NE(quantize(kModels + "llama").find("DeepSeek-V2/V3 checkpoints only"), std::string::npos);
  QuantizeOptions bad_group;
  bad_group.format = QuantFormat::kInt8;
  bad_group.group_size = 48;
  EXPECT_NE(error_of([&] { quantize_checkpoint(kModels + "llama", out.string(), bad_group); }).find("multiple of 32"),
            std::string::npos);
  EXPECT_NE(quantize(kModels + "no_such_model").find("not a model directory"), std::string::npos);
  EXPECT_FALSE(fs::exists(out));

  // A tensor already in float8 without a quantization_config is also refused.
  const fs::path mixed = temp_dir("mixed");
  fs::copy(kModels + "deepseek_v3_fp8", mixed);
  nlohmann::json config = read_json(mixed / "config.json");
  config.erase("quantization_config");
  std::ofstream(mixed / "config.json") << config.dump();
  EXPECT_NE(quantize(mixed.string()).find("is float8_e4m3fn: the checkpoint is already quantized"),
            std::string::npos) << quantize(mixed.string());
  fs::remove_all(mixed);

  // A non-empty output directory needs force, which replaces stale weights.
  fs::create_directories(out);
  std::ofstream(out / "model-00009-of-00009.safetensors") << "stale";
  std::ofstream(out / "notes.txt") << "kept";
  EXPECT_NE(quantize(kModels + "deepseek_v3").find("is not empty (use --force"), std::string::npos);
  EXPECT_EQ(quantize(kModels + "deepseek_v3", /*force=*/true), "");
  EXPECT_FALSE(fs::exists(out / "model-00009-of-00009.safetensors"));
  EXPECT_TRUE(fs::exists(out / "notes.txt"));
  EXPECT_NO_THROW(Checkpoint::open(out.string()));
  EXPECT_NE(error_of([&] { quantize_checkpoint(out.string(), out.string(), {true}); }), "");
  fs::remove_all(out);
}

}  // namespace
}  // namespace basalt

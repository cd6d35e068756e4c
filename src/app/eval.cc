// `basalt eval`: perplexity of a model on a text.
//
// The text is encoded as generate encodes a prompt (the tokenizer's special
// tokens, e.g. a BOS, included) and cut into windows of --context tokens that
// overlap by one token, so every token after the first is predicted exactly
// once, from the tokens before it in its window. Each window is one prefill
// step with the logits of all positions; the negative log-likelihoods of the
// next tokens (log-softmax in double precision) are averaged over the whole
// text, and perplexity = exp(mean NLL).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "app/commands.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace basalt {
namespace {

struct EvalFlags {
  std::string model;
  std::string text_file;
  std::string ids;
  int64_t max_tokens = 0;
  int64_t context = 0;
  bool json = false;
};

std::vector<int32_t> read_text_ids(const std::string& model_dir, const std::string& path) {
  BASALT_CHECK(std::filesystem::is_regular_file(path), "--text-file: '{}' is not a readable file", path);
  std::ifstream in(path, std::ios::binary);
  BASALT_CHECK(in.good(), "--text-file: cannot open '{}'", path);
  std::ostringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  BASALT_CHECK(s.find_first_not_of(" \t\r\n") != std::string::npos, "--text-file: '{}' has no text", path);
  const auto tokenizer_path = std::filesystem::path(model_dir) / "tokenizer.json";
  BASALT_CHECK(std::filesystem::exists(tokenizer_path),
               "{}: no tokenizer.json, so --text-file cannot be encoded", model_dir);
  return Tokenizer::from_file(tokenizer_path.string()).encode(s, /*add_special_tokens=*/true);
}

// -log softmax(row)[target], in double precision.
double next_token_nll(const float* row, int64_t vocab, int32_t target) {
  double max = row[0];
  for (int64_t v = 1; v < vocab; ++v) max = std::max(max, static_cast<double>(row[v]));
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
  return max + std::log(sum) - static_cast<double>(row[target]);
}

void run_eval(const EvalFlags& f, bool text_given, bool ids_given) {
  BASALT_CHECK(text_given != ids_given, "give exactly one of --text-file and --ids");
  BASALT_CHECK(std::filesystem::is_directory(f.model), "--model: '{}' is not a directory", f.model);
  BASALT_CHECK(f.max_tokens >= 0, "--max-tokens must be non-negative (0: the whole text)");
  BASALT_CHECK(f.context == 0 || f.context >= 2, "--context must be at least 2 tokens");

  std::vector<int32_t> ids =
      text_given ? read_text_ids(f.model, f.text_file) : parse_id_list(f.ids, "--ids");
  if (f.max_tokens > 0 && static_cast<int64_t>(ids.size()) > f.max_tokens)
    ids.resize(static_cast<size_t>(f.max_tokens));
  BASALT_CHECK(ids.size() >= 2, "perplexity needs at least 2 tokens, the input has {}", ids.size());

  CpuBackend backend;
  ProgressPrinter progress;
  std::unique_ptr<Model> model = load_model(f.model, backend, std::ref(progress));
  if (const std::string summary = model->summary(); !summary.empty())
    std::fprintf(stderr, "%s\n", summary.c_str());
  const ModelConfig& config = model->config();
  for (int32_t id : ids)
    BASALT_CHECK(id < config.vocab_size, "token id {} is outside the vocabulary (0..{})", id,
                 config.vocab_size - 1);
  const int64_t context = f.context > 0 ? f.context : std::min<int64_t>(config.max_position_embeddings, 512);
  BASALT_CHECK(context <= config.max_position_embeddings,
               "--context {} exceeds the model's context length ({})", context,
               config.max_position_embeddings);
  BASALT_CHECK(context >= 2, "the model's context length ({}) is too short to score tokens", context);

  const int64_t n = static_cast<int64_t>(ids.size()), vocab = config.vocab_size;
  KvBuffers kv = model->allocate_kv(context);
  double nll_sum = 0;
  int64_t scored = 0, forwarded = 0;
  std::chrono::steady_clock::duration forward_time{};
  for (int64_t start = 0; start + 1 < n; start += context - 1) {
    const int64_t end = std::min(start + context, n), len = end - start;
    const std::span<const int32_t> window(ids.data() + start, static_cast<size_t>(len));
    Tensor logits = backend.empty({len, vocab}, DType::kF32);
    Tensor host = Tensor::empty({len, vocab}, DType::kF32);
    const auto t0 = std::chrono::steady_clock::now();
    model->forward(single_sequence_batch(window, 0, /*all_logits=*/true), kv, logits);
    backend.copy(logits, host);
    forward_time += std::chrono::steady_clock::now() - t0;
    forwarded += len;
    for (int64_t i = 0; i + 1 < len; ++i)
      nll_sum += next_token_nll(host.data<float>() + i * vocab, vocab, window[static_cast<size_t>(i + 1)]);
    scored += len - 1;
  }
  const double nll_mean = nll_sum / static_cast<double>(scored);
  const double perplexity = std::exp(nll_mean);
  const double seconds = std::chrono::duration<double>(forward_time).count();
  const double tokens_per_second = seconds > 0 ? static_cast<double>(forwarded) / seconds : 0.0;
  if (f.json) {
    const nlohmann::json out = {{"perplexity", perplexity},
                                {"tokens", scored},
                                {"tokens_per_second", tokens_per_second},
                                {"nll_mean", nll_mean}};
    std::printf("%s\n", out.dump().c_str());
    return;
  }
  std::printf("perplexity %.4f over %lld tokens (mean NLL %.6f nats; windows of %lld tokens)\n",
              perplexity, static_cast<long long>(scored), nll_mean, static_cast<long long>(context));
  std::printf("%.1f tokens/s in forward passes (%lld tokens, %.3f s)\n", tokens_per_second,
              static_cast<long long>(forwarded), seconds);
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto flags = std::make_shared<EvalFlags>();
  CLI::App* cmd = app.add_subcommand("eval", "Measure a model's perplexity on a text file");
  cmd->add_option("--model", flags->model, "Hugging Face model directory")->required();
  CLI::Option* text = cmd->add_option("--text-file", flags->text_file,
                                      "UTF-8 text to score (encoded with the tokenizer's special tokens, e.g. BOS)");
  // Token ids used exactly as given (for comparisons against reference logits).
  CLI::Option* ids = cmd->add_option("--ids", flags->ids, "Token ids, e.g. 1,2,3")->group("");
  cmd->add_option("--max-tokens", flags->max_tokens, "Score only the first N tokens (0: all, the default)");
  cmd->add_option("--context", flags->context,
                  "Window length in tokens (default: the model's context length, at most 512)");
  cmd->add_flag("--json", flags->json,
                "Print {\"perplexity\", \"tokens\", \"tokens_per_second\", \"nll_mean\"}");
  cmd->callback([flags, text, ids] { run_eval(*flags, text->count() > 0, ids->count() > 0); });
}

}  // namespace basalt

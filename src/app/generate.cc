// `basalt generate`: offline generation from a model directory.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "app/commands.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "runtime/generator.h"
#include "tokenizer/tokenizer.h"

namespace basalt {
namespace {

struct GenerateFlags {
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  int max_tokens = 64;
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  int top_logprobs = 0;
  bool json = false;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
};

std::optional<Tokenizer> load_tokenizer_if_present(const std::string& dir) {
  const auto path = std::filesystem::path(dir) / "tokenizer.json";
  if (!std::filesystem::exists(path)) return std::nullopt;
  return Tokenizer::from_file(path.string());
}

void run_generate(const GenerateFlags& f, bool prompt_given, bool prompt_ids_given) {
  BASALT_CHECK(prompt_given != prompt_ids_given, "give exactly one of --prompt and --prompt-ids");
  BASALT_CHECK(std::filesystem::is_directory(f.model), "--model: '{}' is not a directory", f.model);
  BASALT_CHECK(f.max_tokens >= 0, "--max-tokens must be non-negative");
  BASALT_CHECK(f.temperature >= 0, "--temperature must be non-negative");
  BASALT_CHECK(f.top_k >= 0, "--top-k must be non-negative");
  BASALT_CHECK(f.top_p > 0 && f.top_p <= 1, "--top-p must be in (0, 1]");
  BASALT_CHECK(f.min_p >= 0 && f.min_p <= 1, "--min-p must be in [0, 1]");
  BASALT_CHECK(f.top_logprobs >= 0 && f.top_logprobs <= 100, "--top-logprobs must be in 0..100");

  std::optional<Tokenizer> tokenizer = load_tokenizer_if_present(f.model);
  std::vector<int32_t> prompt;
  if (prompt_ids_given) {
    prompt = parse_id_list(f.prompt_ids, "--prompt-ids");
  } else {
    BASALT_CHECK(tokenizer.has_value(), "{}: no tokenizer.json, so --prompt cannot be encoded (use --prompt-ids)", f.model);
    prompt = tokenizer->encode(f.prompt, /*add_special_tokens=*/true);
  }
  BASALT_CHECK(!prompt.empty(), "the prompt encodes to no tokens");

  CpuBackend backend;
  ProgressPrinter progress;
  std::unique_ptr<Model> model = load_model(f.model, backend, std::ref(progress));
  if (const std::string summary = model->summary(); !summary.empty())
    std::fprintf(stderr, "%s\n", summary.c_str());

  GenerateOptions options;
  options.max_tokens = f.max_tokens;
  options.temperature = f.temperature;
  options.top_k = f.top_k;
  options.top_p = f.top_p;
  options.min_p = f.min_p;
  options.seed = f.seed;
  options.top_logprobs = f.top_logprobs;
  options.ignore_eos = f.ignore_eos;
  options.stop_ids = model->config().eos_token_ids;

  // Without --json the text streams to stdout as tokens are produced.
  std::optional<IncrementalDecoder> stream;
  if (!f.json && tokenizer) stream.emplace(*tokenizer, f.skip_special_tokens);
  // Models often have more embedding rows than the tokenizer has tokens
  // (padding to a multiple of 64 or 128); such ids carry no text.
  auto has_text = [&](int32_t id) { return tokenizer && id < tokenizer->vocab_size(); };
  auto on_token = [&](int32_t id) {
    if (!stream || !has_text(id)) return;
    const std::string piece = stream->push(id);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  };
  const GenerateResult result = generate(*model, backend, prompt, options, on_token);

  std::vector<int32_t> text_ids;
  for (int32_t id : result.output_ids)
    if (has_text(id)) text_ids.push_back(id);
  const std::string text = tokenizer ? tokenizer->decode(text_ids, f.skip_special_tokens) : "";
  if (!f.json) {
    if (stream) {
      const std::string rest = stream->flush();
      std::fwrite(rest.data(), 1, rest.size(), stdout);
    } else {
      for (int32_t id : result.output_ids) std::printf("%d ", id);
    }
    std::printf("\n");
    return;
  }
  nlohmann::json out;
  out["prompt_ids"] = prompt;
  out["output_ids"] = result.output_ids;
  out["text"] = text;
  out["finish_reason"] = result.finish_reason;
  nlohmann::json top = nlohmann::json::array();
  for (const auto& step : result.top_logprobs) {
    nlohmann::json alternatives = nlohmann::json::array();
    for (const TokenLogprob& t : step) alternatives.push_back({{"id", t.id}, {"logprob", t.logprob}});
    top.push_back(std::move(alternatives));
  }
  out["top_logprobs"] = std::move(top);
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto flags = std::make_shared<GenerateFlags>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a prompt, offline");
  cmd->add_option("--model", flags->model, "Hugging Face model directory")->required();
  CLI::Option* prompt = cmd->add_option("--prompt", flags->prompt, "Prompt text (encoded with the tokenizer's special tokens, e.g. BOS)");
  CLI::Option* prompt_ids = cmd->add_option("--prompt-ids", flags->prompt_ids, "Prompt token ids, e.g. 1,2,3 (used exactly as given)");
  prompt->excludes(prompt_ids);
  cmd->add_option("--max-tokens", flags->max_tokens, "Tokens to generate at most (default 64)");
  cmd->add_option("--temperature", flags->temperature, "Sampling temperature; 0 is greedy (default 1)");
  cmd->add_option("--top-k", flags->top_k, "Keep the k most likely tokens (0: off)");
  cmd->add_option("--top-p", flags->top_p, "Nucleus sampling mass (1: off)");
  cmd->add_option("--min-p", flags->min_p, "Drop tokens below min-p times the top probability (0: off)");
  cmd->add_option("--seed", flags->seed, "Sampling seed: the same seed gives the same output");
  cmd->add_option("--top-logprobs", flags->top_logprobs, "Report this many most likely tokens per step");
  cmd->add_flag("--json", flags->json, "Print one JSON object");
  cmd->add_flag("--ignore-eos", flags->ignore_eos, "Keep generating after end-of-sequence tokens");
  cmd->add_flag("!--keep-special-tokens", flags->skip_special_tokens, "Keep special tokens in the text");
  cmd->callback([flags, prompt, prompt_ids] {
    run_generate(*flags, prompt->count() > 0, prompt_ids->count() > 0);
  });
}

}  // namespace basalt

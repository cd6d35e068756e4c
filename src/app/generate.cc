// `basalt generate`: offline generation from a model directory.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

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
  bool seed_given = false;
  int top_logprobs = 0;
  bool json = false;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::string logit_bias;
  std::vector<std::string> stop;
  std::string stop_token_ids;
  int min_tokens = 0;
  bool include_stop_str = false;
  int n = 1;
};

// Parses "ID:BIAS,ID:BIAS" (spaces allowed) for --logit-bias.
std::map<int32_t, float> parse_logit_bias(const std::string& text) {
  std::map<int32_t, float> bias;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    const size_t colon = item.find(':');
    BASALT_CHECK(colon != std::string::npos,
                 "--logit-bias: '{}' is not ID:BIAS (e.g. --logit-bias 13:-100,42:5)", item);
    const std::vector<int32_t> id = parse_id_list(item.substr(0, colon), "--logit-bias");
    BASALT_CHECK(id.size() == 1, "--logit-bias: '{}' is not ID:BIAS", item);
    const std::string value = item.substr(colon + 1);
    size_t used = 0;
    float b = 0;
    try {
      b = std::stof(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    BASALT_CHECK(used > 0 && value.find_first_not_of(' ', used) == std::string::npos,
                 "--logit-bias: '{}' is not a number", value);
    bias[id[0]] = b;
    start = comma + 1;
  }
  return bias;
}

// One sample's part of the --json output.
nlohmann::json result_json(const GenerateResult& result) {
  nlohmann::json out;
  out["output_ids"] = result.output_ids;
  out["text"] = result.text;
  out["finish_reason"] = result.finish_reason;
  if (const auto* id = std::get_if<int32_t>(&result.stop_reason)) {
    out["stop_reason"] = *id;
  } else if (const auto* s = std::get_if<std::string>(&result.stop_reason)) {
    out["stop_reason"] = *s;
  } else {
    out["stop_reason"] = nullptr;
  }
  out["seed"] = result.seed;
  nlohmann::json top = nlohmann::json::array();
  for (const auto& step : result.top_logprobs) {
    nlohmann::json alternatives = nlohmann::json::array();
    for (const TokenLogprob& t : step) alternatives.push_back({{"id", t.id}, {"logprob", t.logprob}});
    top.push_back(std::move(alternatives));
  }
  out["top_logprobs"] = std::move(top);
  return out;
}

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
  BASALT_CHECK(f.n >= 1 && f.n <= 64, "--n must be in 1..64");
  BASALT_CHECK(f.min_tokens >= 0 && f.min_tokens <= f.max_tokens,
               "--min-tokens must be in 0..--max-tokens ({})", f.max_tokens);

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
  if (f.seed_given) options.seed = f.seed;
  options.logprobs = f.top_logprobs;
  options.max_logprobs = 100;
  options.ignore_eos = f.ignore_eos;
  options.skip_special_tokens = f.skip_special_tokens;
  options.repetition_penalty = f.repetition_penalty;
  options.frequency_penalty = f.frequency_penalty;
  options.presence_penalty = f.presence_penalty;
  if (!f.logit_bias.empty()) options.logit_bias = parse_logit_bias(f.logit_bias);
  options.stop = f.stop;
  options.include_stop_str_in_output = f.include_stop_str;
  if (!f.stop_token_ids.empty())
    options.stop_token_ids = parse_id_list(f.stop_token_ids, "--stop-token-ids");
  options.min_tokens = f.min_tokens;
  options.eos_ids = model->config().eos_token_ids;
  BASALT_CHECK(options.stop.empty() || tokenizer.has_value(),
               "{}: no tokenizer.json, so --stop strings cannot be matched", f.model);

  // Without --json the text streams to stdout as it becomes final; with
  // --n the samples follow one another, one per line.
  GenerateCallbacks callbacks;
  if (!f.json && tokenizer) {
    callbacks.on_text = [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    };
  }
  const uint64_t seed = f.seed_given ? f.seed : random_seed();
  std::vector<GenerateResult> results;
  for (int i = 0; i < f.n; ++i) {
    options.seed = sample_seed(seed, i);
    results.push_back(
        generate(*model, backend, tokenizer ? &*tokenizer : nullptr, prompt, options, callbacks));
    if (!f.json) {
      if (!tokenizer)
        for (int32_t id : results.back().output_ids) std::printf("%d ", id);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  if (!f.json) return;

  nlohmann::json out;
  out["prompt_ids"] = prompt;
  if (f.n == 1) {
    out.update(result_json(results[0]));
  } else {
    out["seed"] = seed;
    nlohmann::json choices = nlohmann::json::array();
    for (const GenerateResult& r : results) choices.push_back(result_json(r));
    out["choices"] = std::move(choices);
  }
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
  CLI::Option* seed = cmd->add_option("--seed", flags->seed, "Sampling seed: the same seed gives the same output (default: a random seed)");
  cmd->add_option("--top-logprobs", flags->top_logprobs, "Report this many most likely tokens per step");
  cmd->add_flag("--json", flags->json, "Print one JSON object");
  cmd->add_flag("--ignore-eos", flags->ignore_eos, "Keep generating after end-of-sequence tokens");
  cmd->add_flag("!--keep-special-tokens", flags->skip_special_tokens, "Keep special tokens in the text");
  cmd->add_option("--repetition-penalty", flags->repetition_penalty, "Divide positive (multiply negative) logits of tokens in the prompt or output by this (1: off)");
  cmd->add_option("--frequency-penalty", flags->frequency_penalty, "Subtract this times the token's count in the output from its logit, in [-2, 2]");
  cmd->add_option("--presence-penalty", flags->presence_penalty, "Subtract this from the logit of every token already in the output, in [-2, 2]");
  cmd->add_option("--logit-bias", flags->logit_bias, "Add biases to logits, e.g. 13:-100,42:5 (each in [-100, 100])");
  cmd->add_option("--stop", flags->stop, "Stop when the text contains this string (repeatable); it is left out of the text")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_flag("--include-stop-str", flags->include_stop_str, "Keep the matched stop string (or stop token's text) in the text");
  cmd->add_option("--stop-token-ids", flags->stop_token_ids, "Stop after any of these token ids, e.g. 2,7 (even with --ignore-eos)");
  cmd->add_option("--min-tokens", flags->min_tokens, "Generate at least this many tokens before end-of-sequence, stop ids or stop strings can end the output");
  cmd->add_option("--n", flags->n, "Samples to draw for the prompt, one after another (seeds derived from --seed); --json then lists them under \"choices\"");
  cmd->callback([flags, prompt, prompt_ids, seed] {
    flags->seed_given = seed->count() > 0;
    run_generate(*flags, prompt->count() > 0, prompt_ids->count() > 0);
  });
}

}  // namespace basalt

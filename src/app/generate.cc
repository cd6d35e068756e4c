// `basalt generate`: offline generation from a model directory, through the
// engine (runtime/engine.h): one prompt, or a --batch file run concurrently.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "app/commands.h"
#include "app/model_dir.h"
#include "app/device_choice.h"
#include "app/parallel_flags.h"
#include "app/speculation_flags.h"
#include "core/error.h"
#include "grammar/structured_output.h"
#include "model/checkpoint.h"
#include "model/graphed_model.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/grammar_constraint.h"
#include "runtime/kv_pool.h"
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
  bool keep_special_tokens = false;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::string logit_bias;
  std::vector<std::string> stop;
  std::string stop_token_ids;
  int min_tokens = 0;
  bool include_stop_str = false;
  int n = 1;
  std::string batch;
  int max_running = 64;
  int threads = 0;
  ParallelFlags parallel;
  int page_size = 1;
  std::string device = "cpu";
  std::string fp8_compute = "auto";
  bool batch_invariant = false;
  std::string dtype = "auto";
  bool enforce_eager = false;
  bool jump_forward = false;
  bool no_jump_forward = false;
  SpeculationFlags speculation;
  std::string kv_cache_dtype = "auto";
  // Structured output (at most one).
  std::string json_schema_file;
  bool json_object = false;
  std::string regex;
  std::string grammar_file;
  std::vector<std::string> choices;
};

// The --json-schema / --json-object / --regex / --grammar / --choice flag
// given, if any.
std::optional<StructuredOutputSpec> structured_from_flags(const GenerateFlags& f) {
  using Kind = StructuredOutputSpec::Kind;
  std::vector<StructuredOutputSpec> given;
  if (!f.json_schema_file.empty()) given.push_back({Kind::kJsonSchema, read_text_file(f.json_schema_file, "--json-schema")});
  if (f.json_object) given.push_back({Kind::kJsonObject, ""});
  if (!f.regex.empty()) given.push_back({Kind::kRegex, f.regex});
  if (!f.grammar_file.empty()) given.push_back({Kind::kGrammar, read_text_file(f.grammar_file, "--grammar")});
  if (!f.choices.empty()) given.push_back({Kind::kChoice, nlohmann::json(f.choices).dump()});
  BASALT_CHECK(given.size() <= 1, "give at most one of --json-schema, --json-object, --regex, --grammar and --choice");
  if (given.empty()) return std::nullopt;
  return given[0];
}

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

// One sample's part of the --json output, from the engine's events.
nlohmann::json result_json(const RequestOutput& r) {
  GenerateResult g;
  g.output_ids = r.output_ids;
  g.top_logprobs = r.top_logprobs;
  g.finish_reason = to_string(r.reason);
  g.stop_reason = r.stop_reason;
  g.text = r.text;
  g.seed = r.seed;
  return result_json(g);
}

std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

SamplingParams params_from_flags(const GenerateFlags& f) {
  SamplingParams options;
  options.max_tokens = f.max_tokens;
  options.temperature = f.temperature;
  options.top_k = f.top_k;
  options.top_p = f.top_p;
  options.min_p = f.min_p;
  if (f.seed_given) options.seed = f.seed;
  options.logprobs = f.top_logprobs;
  options.ignore_eos = f.ignore_eos;
  options.skip_special_tokens = !f.keep_special_tokens;
  options.repetition_penalty = f.repetition_penalty;
  options.frequency_penalty = f.frequency_penalty;
  options.presence_penalty = f.presence_penalty;
  if (!f.logit_bias.empty()) options.logit_bias = parse_logit_bias(f.logit_bias);
  options.stop = f.stop;
  options.include_stop_str_in_output = f.include_stop_str;
  if (!f.stop_token_ids.empty())
    options.stop_token_ids = parse_id_list(f.stop_token_ids, "--stop-token-ids");
  options.min_tokens = f.min_tokens;
  return options;
}

// One line of a --batch file: the prompt and the fields that override the flags.
struct BatchItem {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

BatchItem parse_batch_line(const std::string& line, const std::string& where, const SamplingParams& base,
                           const Tokenizer* tokenizer) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const std::exception& e) {
    fail("{}: not JSON: {}", where, e.what());
  }
  BASALT_CHECK(j.is_object(), "{}: each line must be a JSON object", where);
  BatchItem item;
  item.params = base;
  SamplingParams& p = item.params;
  std::string key;  // the field being read, for error messages
  try {
    for (const auto& [field_name, value] : j.items()) {
      key = field_name;
      if (key == "prompt") {
        BASALT_CHECK(tokenizer != nullptr, "{}: no tokenizer.json, so \"prompt\" cannot be encoded (use \"prompt_ids\")", where);
        item.prompt = tokenizer->encode(value.get<std::string>(), /*add_special_tokens=*/true);
      } else if (key == "prompt_ids") {
        item.prompt = value.get<std::vector<int32_t>>();
      } else if (key == "max_tokens") {
        p.max_tokens = value.get<int>();
      } else if (key == "temperature") {
        p.temperature = value.get<float>();
      } else if (key == "top_k") {
        p.top_k = value.get<int>();
      } else if (key == "top_p") {
        p.top_p = value.get<float>();
      } else if (key == "min_p") {
        p.min_p = value.get<float>();
      } else if (key == "seed") {
        p.seed = value.get<uint64_t>();
      } else if (key == "top_logprobs" || key == "logprobs") {
        p.logprobs = value.get<int>();
      } else if (key == "ignore_eos") {
        p.ignore_eos = value.get<bool>();
      } else if (key == "skip_special_tokens") {
        p.skip_special_tokens = value.get<bool>();
      } else if (key == "repetition_penalty") {
        p.repetition_penalty = value.get<float>();
      } else if (key == "frequency_penalty") {
        p.frequency_penalty = value.get<float>();
      } else if (key == "presence_penalty") {
        p.presence_penalty = value.get<float>();
      } else if (key == "logit_bias") {
        p.logit_bias.clear();
        for (const auto& [id, bias] : value.items()) p.logit_bias[std::stoi(id)] = bias.get<float>();
      } else if (key == "stop") {
        p.stop = value.is_string() ? std::vector<std::string>{value.get<std::string>()}
                                   : value.get<std::vector<std::string>>();
      } else if (key == "include_stop_str_in_output") {
        p.include_stop_str_in_output = value.get<bool>();
      } else if (key == "stop_token_ids") {
        p.stop_token_ids = value.get<std::vector<int32_t>>();
      } else if (key == "min_tokens") {
        p.min_tokens = value.get<int>();
      } else {
        fail("{}: unknown field \"{}\"", where, key);
      }
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // nlohmann's messages start with "[json.exception.type_error.302] ".
    std::string why = e.what();
    if (why.rfind("[json.exception.", 0) == 0 && why.find("] ") != std::string::npos)
      why = why.substr(why.find("] ") + 2);
    fail("{}: field \"{}\": bad value ({})", where, key, why);
  }
  try {
    p.validate(std::numeric_limits<int32_t>::max(), 100);
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  BASALT_CHECK(j.contains("prompt") != j.contains("prompt_ids"), "{}: give exactly one of \"prompt\" and \"prompt_ids\"", where);
  BASALT_CHECK(!item.prompt.empty(), "{}: the prompt encodes to no tokens", where);
  return item;
}

void run_generate(const GenerateFlags& f, bool prompt_given, bool prompt_ids_given, bool batch_given) {
  BASALT_CHECK(std::filesystem::is_directory(f.model), "--model: '{}' is not a directory", f.model);
  // A node other than 0 of a model over several machines runs its ranks
  // for node 0, which generates (model/multi_node.h); it takes no prompt.
  if (f.parallel.node_rank > 0) {
    check_parallel_flags(f.parallel, f.speculation.algorithm);
    serve_as_node_worker(f.model, *make_flagged_backend(f.device, f.threads, f.fp8_compute, f.batch_invariant, f.dtype),
                         f.parallel);
    return;
  }
  BASALT_CHECK(int{prompt_given} + int{prompt_ids_given} + int{batch_given} == 1,
               "give exactly one of --prompt, --prompt-ids and --batch");
  BASALT_CHECK(f.max_tokens >= 0, "--max-tokens must be non-negative");
  BASALT_CHECK(f.temperature >= 0, "--temperature must be non-negative");
  BASALT_CHECK(f.top_k >= 0, "--top-k must be non-negative");
  BASALT_CHECK(f.top_p > 0 && f.top_p <= 1, "--top-p must be in (0, 1]");
  BASALT_CHECK(f.min_p >= 0 && f.min_p <= 1, "--min-p must be in [0, 1]");
  BASALT_CHECK(f.top_logprobs >= 0 && f.top_logprobs <= 100, "--top-logprobs must be in 0..100");
  BASALT_CHECK(f.n >= 1 && f.n <= 64, "--n must be in 1..64");
  BASALT_CHECK(f.min_tokens >= 0 && f.min_tokens <= f.max_tokens,
               "--min-tokens must be in 0..--max-tokens ({})", f.max_tokens);
  BASALT_CHECK(f.max_running >= 1, "--max-running must be >= 1");
  const std::optional<StructuredOutputSpec> structured = structured_from_flags(f);
  BASALT_CHECK(!structured || f.min_tokens == 0,
               "--min-tokens cannot be combined with structured output: the grammar decides where the output may end");

  std::optional<Tokenizer> tokenizer = load_tokenizer_if_present(f.model);
  const Tokenizer* tok = tokenizer ? &*tokenizer : nullptr;
  const SamplingParams base = params_from_flags(f);
  BASALT_CHECK(base.stop.empty() || tokenizer.has_value(),
               "{}: no tokenizer.json, so --stop strings cannot be matched", f.model);

  std::vector<BatchItem> items;
  if (batch_given) {
    std::FILE* file = std::fopen(f.batch.c_str(), "rb");
    BASALT_CHECK(file != nullptr, "--batch: cannot open '{}'", f.batch);
    std::string content;
    char buffer[1 << 16];
    for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, file)) > 0;) content.append(buffer, n);
    std::fclose(file);
    size_t start = 0;
    for (int line_no = 1; start < content.size(); ++line_no) {
      const size_t nl = std::min(content.find('\n', start), content.size());
      const std::string line = content.substr(start, nl - start);
      start = nl + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      items.push_back(parse_batch_line(line, fmt::format("{}:{}", f.batch, line_no), base, tok));
    }
    BASALT_CHECK(!items.empty(), "--batch: '{}' has no requests", f.batch);
  } else {
    BatchItem item;
    item.params = base;
    if (prompt_ids_given) {
      item.prompt = parse_id_list(f.prompt_ids, "--prompt-ids");
    } else {
      BASALT_CHECK(tokenizer.has_value(), "{}: no tokenizer.json, so --prompt cannot be encoded (use --prompt-ids)", f.model);
      item.prompt = tokenizer->encode(f.prompt, /*add_special_tokens=*/true);
    }
    BASALT_CHECK(!item.prompt.empty(), "the prompt encodes to no tokens");
    items.push_back(std::move(item));
  }

  check_parallel_flags(f.parallel, f.speculation.algorithm);
  check_batch_invariant(f.batch_invariant, f.fp8_compute, f.device, f.parallel.tp > 1 && !f.parallel.dp_attention);
  check_fp8_compute(f.fp8_compute, f.device);
  check_dtype(f.dtype, f.device);
  std::unique_ptr<Backend> backend_owner =
      make_flagged_backend(f.device, f.threads, f.fp8_compute, f.batch_invariant, f.dtype);
  Backend& backend = *backend_owner;
  ProgressPrinter progress;
  // With --dp-attention the requests are spread over an engine per rank
  // (DpAttentionEngines), each KV pool sized as one engine's would be.
  std::unique_ptr<Model> model;
  DpAttentionEngines dp;
  const int graph_batch = f.enforce_eager ? 0 : std::min(f.max_running, 4096);
  if (f.parallel.dp_attention) {
    dp = DpAttentionEngines::load(f.model, f.parallel, backend, std::ref(progress), graph_batch);
  } else {
    model = attach_speculation_head(
        f.speculation, load_model_for_tp(f.model, backend, f.parallel, std::ref(progress), graph_batch), f.model,
        backend);
    // Over GPU ranks each rank records its own graphs (load_model_for_tp).
    if (graph_batch > 0 && f.parallel.tp == 1)
      model = make_graphed_model(std::move(model), backend, {.max_batch = graph_batch});
  }
  const Model& shape = model ? *model : dp.model->rank(0);
  if (const std::string summary = shape.summary(); !summary.empty()) std::fprintf(stderr, "%s\n", summary.c_str());

  // The pool holds every request at its longest at once, so nothing waits
  // for memory (capped by the budget the engine derives from host memory).
  EngineOptions options;
  options.max_logprobs = 100;
  options.max_running = f.max_running;
  options.jump_forward = jump_forward_choice(f.jump_forward, f.no_jump_forward, backend);
  apply_speculation_flags(f.speculation, backend, options, f.enforce_eager ? 0 : std::min(f.max_running, 4096));
  options.kv_dtype = kv_cache_dtype(f.kv_cache_dtype, backend);
  int64_t slots = 0;
  for (const BatchItem& item : items)
    slots += (static_cast<int64_t>(item.prompt.size()) + std::max(item.params.max_tokens, 0)) *
             (batch_given ? 1 : f.n);
  const int64_t budget_slots = KvPool::slots_for_budget(shape.kv_bytes_per_slot(options.kv_dtype),
                                                        KvPool::host_memory_budget(0.1));
  options.page_size = f.page_size;
  // Whole pages, one per request more than the tokens need (each request's
  // last page is its own).
  const int64_t requests = batch_given ? static_cast<int64_t>(items.size()) : f.n;
  slots += requests * (f.page_size - 1);
  slots = (slots + f.page_size - 1) / f.page_size * f.page_size;
  options.kv_slots = std::max<int64_t>(f.page_size, std::min(slots, budget_slots));
  std::unique_ptr<Engine> single;
  if (model) {
    single = std::make_unique<Engine>(*model, backend, tok, options);
  } else {
    // Every rank's pool can hold every request (start() splits kv_slots).
    options.kv_slots *= dp.model->world();
    dp.start(tok, options);
  }
  EngineClient& engine = single ? static_cast<EngineClient&>(*single) : *dp.engines;

  // Each request (and sample) walks the grammar on its own; they share its
  // compiled form and mask cache.
  std::shared_ptr<const TokenMasker> grammar;
  if (structured) {
    BASALT_CHECK(tokenizer.has_value(), "{}: no tokenizer.json, so structured output has no token bytes", f.model);
    const ModelConfig& config = engine.model_config();
    GrammarCache cache(TokenVocabulary::from_tokenizer(*tokenizer, static_cast<int32_t>(config.vocab_size),
                                                       config.eos_token_ids));
    try {
      grammar = cache.get(*structured);
    } catch (const Error& e) {
      fail("structured output: {}", e.what());
    }
  }
  auto constraint = [&]() -> std::shared_ptr<TokenConstraint> {
    return grammar ? std::make_shared<GrammarConstraint>(grammar, tok) : nullptr;
  };

  if (!batch_given) {
    // --n samples run concurrently, with seeds derived from one seed.
    const uint64_t seed = f.seed_given ? f.seed : random_seed();
    std::vector<RequestHandle> handles;
    for (int i = 0; i < f.n; ++i) {
      EngineRequest request{items[0].prompt, items[0].params, 0, 0, std::nullopt, constraint(), {}, {}};
      request.params.seed = sample_seed(seed, i);
      handles.push_back(engine.submit(std::move(request)));
    }
    // Without --json each sample's text goes to stdout as it becomes final
    // (the first live, the others after it), one sample per line.
    std::vector<RequestOutput> results;
    for (RequestHandle& handle : handles) {
      RequestOutput result;
      while (std::optional<EngineEvent> e = handle->next_event()) {
        if (!f.json && tokenizer && !e->text.empty()) {
          std::fwrite(e->text.data(), 1, e->text.size(), stdout);
          std::fflush(stdout);
        }
        result.text += e->text;
        if (e->kind == EngineEvent::Kind::kToken) {
          result.output_ids.push_back(e->token);
          if (!e->logprobs.empty()) result.top_logprobs.push_back(std::move(e->logprobs));
          continue;
        }
        result.reason = e->reason;
        result.stop_reason = std::move(e->stop_reason);
        result.error = std::move(e->error);
        result.seed = e->seed;
        result.usage = e->usage;
      }
      BASALT_CHECK(result.reason != FinishReason::kError, "{}", result.error);
      if (!f.json) {
        if (!tokenizer)
          for (int32_t id : result.output_ids) std::printf("%d ", id);
        std::printf("\n");
        std::fflush(stdout);
      }
      results.push_back(std::move(result));
    }
    if (!f.json) return;
    nlohmann::json out;
    out["prompt_ids"] = items[0].prompt;
    if (options.speculative.enabled()) {
      int64_t drafted = 0, accepted = 0;
      for (const RequestOutput& r : results) {
        drafted += r.usage.draft_tokens;
        accepted += r.usage.accepted_tokens;
      }
      out["speculative"] = {{"draft_tokens", drafted}, {"accepted_tokens", accepted}};
    }
    if (f.n == 1) {
      out.update(result_json(results[0]));
    } else {
      out["seed"] = seed;
      nlohmann::json choices = nlohmann::json::array();
      for (const RequestOutput& r : results) choices.push_back(result_json(r));
      out["choices"] = std::move(choices);
    }
    std::printf("%s\n", dump(out).c_str());
    return;
  }

  // --batch: every request at once; one JSON line each, in input order.
  std::vector<RequestHandle> handles;
  for (const BatchItem& item : items)
    handles.push_back(engine.submit(EngineRequest{item.prompt, item.params, 0, 0, std::nullopt, constraint(), {}, {}}));
  for (size_t i = 0; i < handles.size(); ++i) {
    const RequestOutput r = collect(*handles[i]);
    nlohmann::json out;
    out["index"] = i;
    out["prompt_ids"] = items[i].prompt;
    out.update(result_json(r));
    out["usage"] = {{"prompt_tokens", r.usage.prompt_tokens},
                    {"completion_tokens", r.usage.completion_tokens},
                    {"cached_prompt_tokens", r.usage.cached_prompt_tokens}};
    if (options.speculative.enabled())
      out["speculative"] = {{"draft_tokens", r.usage.draft_tokens}, {"accepted_tokens", r.usage.accepted_tokens}};
    if (r.reason == FinishReason::kError) out["error"] = r.error;
    std::printf("%s\n", dump(out).c_str());
    std::fflush(stdout);
  }
  const EngineMetrics m = engine.metrics();
  std::fprintf(stderr, "%zu requests: %llu prompt tokens (%.1f%% from the prefix cache), %llu output tokens, %llu steps\n",
               items.size(), static_cast<unsigned long long>(m.prompt_tokens), 100.0 * m.cache_hit_rate(),
               static_cast<unsigned long long>(m.output_tokens), static_cast<unsigned long long>(m.steps));
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto flags = std::make_shared<GenerateFlags>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a prompt, offline");
  cmd->add_option("--model", flags->model, "Hugging Face model directory (default: the bundled model)");
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
  cmd->add_flag("--keep-special-tokens", flags->keep_special_tokens, "Keep special tokens in the text");
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
  cmd->add_option("--n", flags->n, "Samples to draw for the prompt, run together (seeds derived from --seed); --json then lists them under \"choices\"");
  CLI::Option* batch = cmd->add_option("--batch", flags->batch, "Run many requests together from a JSONL file: one {\"prompt\": ...} or {\"prompt_ids\": [...]} object per line, with optional sampling fields (max_tokens, temperature, top_k, top_p, min_p, seed, stop, stop_token_ids, ...) overriding the flags; prints one JSON line per request, in input order");
  batch->excludes(prompt)->excludes(prompt_ids);
  cmd->add_option("--max-running", flags->max_running, "Requests decoded together at most (default 64)");
  cmd->add_option("--threads", flags->threads,
                  "CPU backend threads (default 0: the BASALT_NUM_THREADS environment variable, else one per "
                  "hardware thread)");
  add_parallel_flags(*cmd, flags->parallel);
  cmd->add_option("--device", flags->device, std::string("Backend: ") + available_devices() + " (default cpu)");
  cmd->add_option("--dtype", flags->dtype,
                  kDtypeHelp);
  cmd->add_option("--fp8-compute", flags->fp8_compute,
                  "How block-FP8 weights multiply: w8a8 quantizes the activations per 1x128 group (DeepSeek-V3's inference, the GPU default), w8a16 keeps them (weight-only: exact up to the weights' own rounding; on a GPU it keeps a bf16 copy of every FP8 weight); auto: the device's default");
  cmd->add_flag("--batch-invariant", flags->batch_invariant, kBatchInvariantHelp);
  cmd->add_option("--kv-cache-dtype", flags->kv_cache_dtype,
                  "KV cache element type: auto (bf16 on a GPU, f32 on the CPU), bf16 or f32 (default auto)");
  cmd->add_flag("--enforce-eager", flags->enforce_eager,
                "Launch every decode step's kernels one by one instead of replaying CUDA graphs (GPU only)");
  cmd->add_option("--page-size", flags->page_size, "KV slots per page (default 1)")->check(CLI::Range(1, 4096));
  cmd->add_option("--json-schema", flags->json_schema_file, "Structured output: the text is a JSON instance of the schema in this file (compact JSON, properties in the schema's order)");
  cmd->add_flag("--jump-forward", flags->jump_forward,
                "Structured output: draft the text the grammar forces (keys, punctuation) and verify it in one step; "
                "the output is token for token that of plain decoding (default on with --device cuda, off on the CPU, "
                "where the extra rows cost compute)");
  cmd->add_flag("--no-jump-forward", flags->no_jump_forward,
                "Structured output: sample every token (see --jump-forward)");
  add_speculation_flags(*cmd, flags->speculation);
  cmd->add_flag("--json-object", flags->json_object, "Structured output: the text is a JSON object");
  cmd->add_option("--regex", flags->regex, "Structured output: the whole text matches this regular expression (ECMAScript syntax)");
  cmd->add_option("--grammar", flags->grammar_file, "Structured output: the text is a sentence of the EBNF (GBNF) grammar in this file, from its rule root");
  cmd->add_option("--choice", flags->choices, "Structured output: the text is one of these strings (repeatable)");
  cmd->callback([flags, prompt, prompt_ids, batch, seed] {
    flags->model = model_dir_or_bundled(flags->model);
    flags->seed_given = seed->count() > 0;
    run_generate(*flags, prompt->count() > 0, prompt_ids->count() > 0, batch->count() > 0);
  });
}

}  // namespace basalt

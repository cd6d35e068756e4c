// basalt_bench_structured: what structured output costs the engine, on the
// bundled model on the CPU backend, or any model directory on any device.
// The same requests run unconstrained, constrained by a JSON schema whose
// instances never end (an array of records, so every request writes exactly
// --tokens tokens either way), and constrained with jump-forward (the
// forced text drafted and verified, so the tokens are those without it);
// output tokens/s, engine steps, forced tokens drafted and accepted, at
// batch 1 and 64, best of --repeats runs, the three modes alternated. The
// masks are computed on the host while the device runs the forward pass,
// so on a GPU the question is whether they hide behind it.
//
//   basalt_bench_structured [--tokens N] [--repeats N] [--batches 1,64] [--model DIR] [--device cpu|cuda]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "app/device_choice.h"
#include "bench_util.h"
#include "grammar/structured_output.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/grammar_constraint.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace basalt;

const char* kSchema = R"({"type": "array", "items": {"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
  "role": {"enum": ["admin", "user", "guest"]}, "active": {"type": "boolean"}},
  "required": ["name", "age", "role", "active"], "additionalProperties": false}})";

enum class Mode { kFree, kConstrained, kJumpForward };
const char* name(Mode m) {
  switch (m) {
    case Mode::kFree: return "unconstrained";
    case Mode::kConstrained: return "schema";
    case Mode::kJumpForward: return "schema + jump-forward";
  }
  return "?";
}

struct Result {
  double tokens_per_s = 0;
  uint64_t steps = 0, tokens = 0, drafted = 0, forced = 0;
  double exec_us = 0, sched_us = 0;  // per step: model + sampler (wall), the scheduling thread's CPU
};

Result run(Model& model, Backend& backend, const Tokenizer& tok, const std::shared_ptr<const TokenMasker>& masker,
           Mode mode, int batch, int tokens) {
  EngineOptions o;
  o.max_running = batch;
  o.kv_slots = static_cast<int64_t>(batch) * (tokens + 64);
  o.kv_dtype = kv_cache_dtype("auto", backend);
  o.jump_forward = mode == Mode::kJumpForward;
  o.speculative.adaptive_from_batch = adaptive_drafts_from_batch(backend);
  Engine engine(model, backend, &tok, o);
  std::vector<RequestHandle> handles;
  const auto start = bench::Clock::now();
  for (int i = 0; i < batch; ++i) {
    SamplingParams p;
    p.max_tokens = tokens;
    p.temperature = 1.0f;
    p.seed = 100 + static_cast<uint64_t>(i);
    p.ignore_eos = true;
    EngineRequest r{tok.encode("People, as JSON records:", true), p, 0, 0, std::nullopt, nullptr, {}, {}};
    if (mode != Mode::kFree) r.constraint = std::make_shared<GrammarConstraint>(masker, &tok);
    handles.push_back(engine.submit(std::move(r)));
  }
  for (RequestHandle& h : handles) {
    const RequestOutput out = collect(*h);
    if (out.reason == FinishReason::kError) {
      std::fprintf(stderr, "request failed (%s, batch %d): %s\n", name(mode), batch, out.error.c_str());
      std::exit(1);
    }
  }
  const double wall = bench::seconds_since(start);
  const EngineMetrics m = engine.metrics();
  // Forced: drafts of forced text accepted.
  return {static_cast<double>(m.output_tokens) / wall, m.steps, m.output_tokens, m.draft_tokens,
          m.jump_forward_tokens,
          m.execute_time.mean() * 1e6, m.schedule_time.mean() * 1e6};
}

}  // namespace

int main(int argc, char** argv) {
  int tokens = 128, repeats = 3;
  std::vector<int> batches = {1, 64};
  std::string dir = std::string(BASALT_SOURCE_DIR) + "/models/basalt-mini";
  std::string device = "cpu";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tokens") tokens = std::atoi(argv[i + 1]);
    else if (flag == "--repeats") repeats = std::max(1, std::atoi(argv[i + 1]));
    else if (flag == "--model") dir = argv[i + 1];
    else if (flag == "--device") device = argv[i + 1];
    else if (flag == "--batches") {
      batches.clear();
      for (const char* p = argv[i + 1]; *p;) {
        batches.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    }
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  std::unique_ptr<Backend> backend_owner = make_backend(device);
  Backend& backend = *backend_owner;
  std::unique_ptr<Model> model = load_model(dir, backend);
  const Tokenizer tok = Tokenizer::from_file(dir + "/tokenizer.json");
  GrammarCache cache(TokenVocabulary::from_tokenizer(tok, static_cast<int32_t>(model->config().vocab_size),
                                                     model->config().eos_token_ids));
  const std::shared_ptr<const TokenMasker> masker =
      cache.get({StructuredOutputSpec::Kind::kJsonSchema, kSchema});
  std::printf("%s (vocabulary %lld), %s backend, %d output tokens per request, best of %d\n", dir.c_str(),
              static_cast<long long>(model->config().vocab_size), device.c_str(), tokens, repeats);
  std::printf("%6s  %-22s %12s %8s %8s %8s %10s %13s %14s\n", "batch", "mode", "tokens/s", "steps", "drafted",
              "accepted", "vs free", "exec us/step", "sched us/step");
  for (int batch : batches) {
    const Mode modes[] = {Mode::kFree, Mode::kConstrained, Mode::kJumpForward};
    Result best[3];
    for (int r = 0; r < repeats; ++r)
      for (int m = 0; m < 3; ++m) {
        const Result x = run(*model, backend, tok, masker, modes[m], batch, tokens);
        if (x.tokens_per_s > best[m].tokens_per_s) best[m] = x;
      }
    for (int m = 0; m < 3; ++m)
      std::printf("%6d  %-22s %12.1f %8llu %8llu %8llu %9.2fx %13.1f %14.1f\n", batch, name(modes[m]),
                  best[m].tokens_per_s, static_cast<unsigned long long>(best[m].steps),
                  static_cast<unsigned long long>(best[m].drafted), static_cast<unsigned long long>(best[m].forced),
                  best[m].tokens_per_s / best[0].tokens_per_s, best[m].exec_us, best[m].sched_us);
  }
}

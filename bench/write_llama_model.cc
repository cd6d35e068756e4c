// Writes a random-weight, Llama-3.1-8B-shaped bf16 model directory that
// `basalt serve` (on --device cuda, or the CPU for small shapes) loads and
// serves: for load tests of the server on a real model size without
// downloading one.
//
//   basalt_write_llama_model --out DIR [--layers 32] [--hidden 4096] [--intermediate 14336]
//                            [--heads 32] [--kv-heads 8] [--tokenizer-from DIR] [--force]
//
// DIR gets config.json, model.safetensors (bench/llama_checkpoint.h: the
// layers hold the same random matrices, each written out in full), and the
// tokenizer of --tokenizer-from (default: the bundled models/basalt-mini):
// tokenizer.json, tokenizer_config.json with its chat template, and
// generation_config.json when present. The vocabulary is the tokenizer's
// (8,192 for the bundled one, not Llama 3's 128,256), so every id the model
// can sample has text and every prompt id is in range; the lm_head and the
// embedding shrink accordingly (all 32 layers: 14.1 GB of weights instead of
// 16.1 GB). bos / eos ids come from the tokenizer directory's config.json
// (or generation_config.json). Prints the weight bytes and the time taken.
// A non-empty DIR needs --force. Exit status 2 on bad flags, 1 on errors.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "bench_util.h"
#include "llama_checkpoint.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using namespace basalt;
using namespace basalt::bench;

struct Flags {
  std::string out;
  std::string tokenizer_from = std::string(BASALT_SOURCE_DIR) + "/models/basalt-mini";
  LlamaShape shape;
  bool force = false;
};

const char* const kUsage =
    "usage: basalt_write_llama_model --out DIR [--layers 32] [--hidden 4096] [--intermediate 14336]\n"
    "                                [--heads 32] [--kv-heads 8] [--tokenizer-from DIR] [--force]\n";

bool parse(int argc, char** argv, Flags* f) {
  const bool walked = walk_flags(
      argc, argv, kUsage, {"--force"}, [&](const std::string&) { f->force = true; },
      [&](const std::string& flag, const std::string& value) {
        if (flag == "--out") {
          f->out = value;
          return true;
        }
        if (flag == "--tokenizer-from") {
          f->tokenizer_from = value;
          return true;
        }
        char* end = nullptr;
        const long long n = std::strtoll(value.c_str(), &end, 10);
        if (end == value.c_str() || *end != '\0' || n < 1 || n > (1ll << 20)) {
          std::fprintf(stderr, "%s %s: expected a positive integer\n", flag.c_str(), value.c_str());
          return false;
        }
        if (flag == "--layers") f->shape.layers = static_cast<int>(n);
        else if (flag == "--hidden") f->shape.hidden = n;
        else if (flag == "--intermediate") f->shape.intermediate = n;
        else if (flag == "--heads") f->shape.heads = n;
        else if (flag == "--kv-heads") f->shape.kv_heads = n;
        else {
          std::fprintf(stderr, "unknown flag %s\n%s", flag.c_str(), kUsage);
          return false;
        }
        return true;
      });
  if (!walked) return false;
  if (f->out.empty()) {
    std::fprintf(stderr, "--out DIR is required\n%s", kUsage);
    return false;
  }
  return true;
}

nlohmann::json read_json_or_empty(const fs::path& path) {
  std::ifstream in(path);
  if (!in.good()) return nlohmann::json::object();
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  BASALT_CHECK(!j.is_discarded() && j.is_object(), "{}: not a JSON object", path.string());
  return j;
}

void run(const Flags& f) {
  const fs::path src = f.tokenizer_from, out = f.out;
  BASALT_CHECK(fs::exists(src / "tokenizer.json"), "--tokenizer-from {}: no tokenizer.json there", src.string());
  if (fs::exists(out) && !fs::is_empty(out)) {
    BASALT_CHECK(f.force, "--out {}: not empty (--force overwrites it)", out.string());
    fs::remove_all(out);
  }
  fs::create_directories(out);
  const auto start = std::chrono::steady_clock::now();

  LlamaShape shape = f.shape;
  shape.vocab = Tokenizer::from_file((src / "tokenizer.json").string()).vocab_size();
  // The special ids the tokenizer's model was trained with; Llama 3's would
  // be outside this vocabulary.
  nlohmann::json extra = nlohmann::json::object();
  const nlohmann::json src_config = read_json_or_empty(src / "config.json");
  const nlohmann::json src_generation = read_json_or_empty(src / "generation_config.json");
  for (const char* key : {"bos_token_id", "eos_token_id"}) {
    if (src_generation.contains(key)) extra[key] = src_generation[key];
    else if (src_config.contains(key)) extra[key] = src_config[key];
  }
  BASALT_CHECK(extra.contains("eos_token_id"), "--tokenizer-from {}: no eos_token_id in its config.json or "
               "generation_config.json", src.string());
  std::printf("writing a random-weight Llama (%d layers, hidden %lld, intermediate %lld, %lld/%lld heads, "
              "vocabulary %lld) to %s\n", shape.layers, static_cast<long long>(shape.hidden),
              static_cast<long long>(shape.intermediate), static_cast<long long>(shape.heads),
              static_cast<long long>(shape.kv_heads), static_cast<long long>(shape.vocab), out.string().c_str());
  std::fflush(stdout);
  const uint64_t bytes = write_random_llama(out, shape, extra);
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    if (fs::exists(src / name)) fs::copy_file(src / name, out / name, fs::copy_options::overwrite_existing);
  std::printf("wrote %.3f GB of bf16 weights in %.1f s\n", static_cast<double>(bytes) / 1e9,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!parse(argc, argv, &flags)) return 2;
  try {
    run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "basalt_write_llama_model: %s\n", e.what());
    return 1;
  }
  return 0;
}

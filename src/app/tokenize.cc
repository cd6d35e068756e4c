// `basalt tokenize` and `basalt detokenize`.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/model_dir.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace basalt {
namespace {

struct TokenizeFlags {
  std::string model;
  std::string text;
  std::string ids;
  bool add_special_tokens = false;
  bool skip_special_tokens = false;
  bool json = false;
};

Tokenizer open_tokenizer(const std::string& flag_value) {
  const std::string dir = model_dir_or_bundled(flag_value);
  BASALT_CHECK(std::filesystem::is_directory(dir), "--model: '{}' is not a directory", dir);
  const auto path = std::filesystem::path(dir) / "tokenizer.json";
  BASALT_CHECK(std::filesystem::exists(path), "{}: no tokenizer.json in model directory", dir);
  return Tokenizer::from_file(path.string());
}

std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

void add_tokenize_commands(CLI::App& app) {
  auto flags = std::make_shared<TokenizeFlags>();

  CLI::App* tok = app.add_subcommand("tokenize", "Encode text into token ids");
  tok->add_option("--model", flags->model, "Hugging Face model directory (default: the bundled model)");
  tok->add_option("--text", flags->text, "Text to encode")->required();
  tok->add_flag("--add-special-tokens", flags->add_special_tokens, "Apply the post-processor (e.g. add BOS)");
  tok->add_flag("--json", flags->json, "Print {\"ids\": [...]}");
  tok->callback([flags] {
    const Tokenizer tokenizer = open_tokenizer(flags->model);
    const std::vector<int32_t> ids = tokenizer.encode(flags->text, flags->add_special_tokens);
    if (flags->json) {
      std::printf("%s\n", dump({{"ids", ids}}).c_str());
    } else {
      for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? ",%d" : "%d", ids[i]);
      std::printf("\n");
    }
  });

  CLI::App* detok = app.add_subcommand("detokenize", "Decode token ids into text");
  detok->add_option("--model", flags->model, "Hugging Face model directory (default: the bundled model)");
  detok->add_option("--ids", flags->ids, "Token ids, e.g. 1,2,3")->required();
  detok->add_flag("--skip-special-tokens", flags->skip_special_tokens, "Leave special tokens out of the text");
  detok->add_flag("--json", flags->json, "Print {\"text\": \"...\"}");
  detok->callback([flags] {
    const Tokenizer tokenizer = open_tokenizer(flags->model);
    const std::vector<int32_t> ids = parse_id_list(flags->ids, "--ids");
    const std::string text = tokenizer.decode(ids, flags->skip_special_tokens);
    if (flags->json) {
      std::printf("%s\n", dump({{"text", text}}).c_str());
    } else {
      std::printf("%s\n", text.c_str());
    }
  });
}

}  // namespace basalt

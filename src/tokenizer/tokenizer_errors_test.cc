// Hostile and malformed inputs: every problem surfaces as basalt::Error that
// names the source and the JSON field, never as a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace basalt {
namespace {

using nlohmann::json;

// A minimal valid byte-level tokenizer: vocab {a, b, ab, Ġ, Ġab}, two merges.
json minimal() {
  return json::parse(R"({
    "version": "1.0",
    "added_tokens": [{"id": 5, "content": "<eos>", "special": true, "normalized": false,
                      "lstrip": false, "rstrip": false, "single_word": false}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "post_processor": null,
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "\u0120ab": 4},
              "merges": ["a b", ["\u0120", "ab"]]}
  })");
}

// The message of the Error that loading `j` throws ("" if none).
std::string load_error(const json& j) {
  try {
    Tokenizer::from_json(j.dump(), "bad.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_error(const json& j, const std::string& field, const std::string& words) {
  std::string msg = load_error(j);
  ASSERT_FALSE(msg.empty()) << "loaded without error; expected " << field;
  EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find(field), std::string::npos) << msg;
  EXPECT_NE(msg.find(words), std::string::npos) << msg;
}

TEST(TokenizerErrorsTest, MinimalTokenizerWorks) {
  Tokenizer tok = Tokenizer::from_json(minimal().dump(), "minimal");
  EXPECT_EQ(tok.encode("ab ab<eos>", true), (std::vector<int32_t>{2, 4, 5}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{2, 4, 5}, true), "ab ab");
  EXPECT_EQ(tok.vocab_size(), 6);
  EXPECT_FALSE(tok.bos_id().has_value());
}

TEST(TokenizerErrorsTest, BadJson) {
  try {
    Tokenizer::from_json("{\"model\": ", "bad.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.json: invalid JSON"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tokenizer::from_json("[1, 2]", "bad.json"), Error);
  EXPECT_THROW(Tokenizer::from_json("", "bad.json"), Error);
}

TEST(TokenizerErrorsTest, StructuralProblemsNameTheField) {
  json j = minimal();
  j.erase("model");
  expect_error(j, "model", "missing");

  j = minimal();
  j["version"] = "2.0";
  expect_error(j, "version", "version");

  j = minimal();
  j["model"]["type"] = "WordPiece";
  expect_error(j, "model.type", "only BPE");

  j = minimal();
  j["model"]["vocab"]["c"] = -3;
  expect_error(j, "model.vocab[\"c\"]", "integer");

  j = minimal();
  j["model"]["vocab"] = json::array();
  expect_error(j, "model.vocab", "object");

  j = minimal();
  j["model"]["merges"][0] = "a x";
  expect_error(j, "model.merges[0]", "\"x\", which is not in the vocab");

  j = minimal();
  j["model"]["merges"][0] = "ab";
  expect_error(j, "model.merges[0]", "one space");

  j = minimal();
  j["model"]["merges"][1] = json::array({"b", "a"});
  expect_error(j, "model.merges[1]", "merge result \"ba\"");

  j = minimal();
  j["model"]["merges"][1] = 7;
  expect_error(j, "model.merges[1]", "expected");

  j = minimal();
  j["model"]["dropout"] = 0.1;
  expect_error(j, "model.dropout", "not supported");

  j = minimal();
  j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  expect_error(j, "pre_tokenizer.type", "unsupported pre-tokenizer \"BertPreTokenizer\"");

  j = minimal();
  j["pre_tokenizer"] = json::parse(R"js({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "(?<=x)"}, "behavior": "Isolated", "invert": false}]})js");
  expect_error(j, "pre_tokenizer.pretokenizers[0].pattern", "lookbehind");

  j = minimal();
  j["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", "a"}}},
                        {"behavior", "Sideways"},
                        {"invert", false}};
  expect_error(j, "pre_tokenizer.behavior", "Sideways");

  j = minimal();
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}};
  expect_error(j, "pre_tokenizer.replacement", "one character");

  j = minimal();
  j["pre_tokenizer"] = {{"type", "Metaspace"},
                        {"replacement", "_"},
                        {"add_prefix_space", false},
                        {"prepend_scheme", "always"}};
  expect_error(j, "pre_tokenizer", "prepend_scheme");

  j = minimal();
  j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", ""}};
  expect_error(j, "normalizer.type", "unsupported normalizer \"Precompiled\"");

  j = minimal();
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", ""}}}, {"content", "x"}};
  expect_error(j, "normalizer.pattern.String", "empty");

  j = minimal();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(j, "decoder.type", "unsupported decoder");

  j = minimal();
  j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", -1}, {"stop", 0}};
  expect_error(j, "decoder.start", "non-negative");

  j = minimal();
  j["post_processor"] = json::parse(R"({"type": "TemplateProcessing", "special_tokens": {},
      "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]})");
  expect_error(j, "post_processor.single[0]", "<bos>");

  j = minimal();
  j["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "special_tokens": {"<eos>": {"id": "<eos>", "ids": [99], "tokens": ["<eos>"]}},
      "single": [{"SpecialToken": {"id": "<eos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]})");
  expect_error(j, "post_processor", "outside the vocabulary");

  j = minimal();
  j["post_processor"] = {{"type", "Mystery"}};
  expect_error(j, "post_processor.type", "Mystery");

  j = minimal();
  j["added_tokens"] = {{"content", "x"}};
  expect_error(j, "added_tokens", "array");

  j = minimal();
  j["added_tokens"][0].erase("content");
  expect_error(j, "added_tokens[0]", "content");

  j = minimal();
  j["added_tokens"][0]["special"] = "yes";
  expect_error(j, "added_tokens[0].special", "true or false");
}

TEST(TokenizerErrorsTest, BadRuntimeInputs) {
  Tokenizer tok = Tokenizer::from_json(minimal().dump(), "minimal");
  EXPECT_THROW(tok.encode("a\xFF", true), Error);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{0, 6}, false), Error);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{-1}, false), Error);
  EXPECT_THROW(tok.id_to_token(1000), Error);
  EXPECT_FALSE(tok.token_to_id("zzz").has_value());
  EXPECT_THROW(Tokenizer::from_file("no/such/dir/tokenizer.json"), Error);

  // An unk_token that is not in the vocabulary fails when it is needed.
  json j = minimal();
  j["model"]["unk_token"] = "<unk>";
  Tokenizer with_unk = Tokenizer::from_json(j.dump(), "unk");
  EXPECT_EQ(with_unk.encode("ab", false), (std::vector<int32_t>{2}));
  EXPECT_THROW(with_unk.encode("c", false), Error);
}

// Random truncations and byte flips of a real tokenizer.json either load or
// throw basalt::Error.
TEST(TokenizerErrorsTest, MutatedFilesNeverCrash) {
  std::ifstream in(std::string(BASALT_TESTDATA) + "/tokenizers/llama3/tokenizer.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string original = ss.str();
  ASSERT_FALSE(original.empty());
  std::mt19937 rng(7);
  int loaded = 0, rejected = 0;
  for (int i = 0; i < 60; ++i) {
    std::string text = original;
    if (i % 3 == 0) {
      text.resize(rng() % text.size());
    } else {
      for (int k = 0; k < 4; ++k) text[rng() % text.size()] = static_cast<char>(rng() % 256);
    }
    try {
      Tokenizer tok = Tokenizer::from_json(text, "mutated");
      tok.encode("Hello world 123 <|eot_id|>", true);
      ++loaded;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(loaded + rejected, 60);
}

TEST(TokenizerConfigTest, ParsesTokensAndTemplates) {
  TokenizerConfig c = parse_tokenizer_config(R"({
    "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
    "eos_token": "</s>", "pad_token": null, "add_bos_token": true,
    "chat_template": [{"name": "default", "template": "{{ messages }}"},
                      {"name": "tool_use", "template": "{{ tools }}"}]
  })",
                                             "tokenizer_config.json");
  EXPECT_EQ(c.bos_token, "<s>");
  EXPECT_EQ(c.eos_token, "</s>");
  EXPECT_FALSE(c.pad_token.has_value());
  EXPECT_EQ(c.add_bos_token, true);
  EXPECT_FALSE(c.add_eos_token.has_value());
  EXPECT_EQ(c.chat_template, "{{ messages }}");
  EXPECT_EQ(c.named_chat_templates.at("tool_use"), "{{ tools }}");

  EXPECT_THROW(parse_tokenizer_config(R"({"eos_token": 3})", "cfg"), Error);
  EXPECT_THROW(parse_tokenizer_config(R"({"add_bos_token": "yes"})", "cfg"), Error);
  EXPECT_THROW(parse_tokenizer_config(R"({"chat_template": 1})", "cfg"), Error);
  EXPECT_THROW(parse_tokenizer_config("not json", "cfg"), Error);
}

TEST(TokenizerConfigTest, LoadsModelDirectory) {
  namespace fs = std::filesystem;
  fs::path dir =
      fs::temp_directory_path() /
      ("basalt_tok_dir_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  fs::create_directories(dir);
  fs::copy_file(std::string(BASALT_TESTDATA) + "/tokenizers/llama3/tokenizer.json",
                dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})";
  std::ofstream(dir / "chat_template.jinja")
      << "{% for m in messages %}{{ m.content }}{% endfor %}";
  TokenizerBundle b = load_tokenizer_dir(dir.string());
  EXPECT_EQ(b.config.eos_token, "<|eot_id|>");
  EXPECT_EQ(b.config.chat_template, "{% for m in messages %}{{ m.content }}{% endfor %}");
  EXPECT_EQ(b.tokenizer.token_to_id(*b.config.bos_token), b.tokenizer.bos_id());
  fs::remove_all(dir);
  EXPECT_THROW(load_tokenizer_dir(dir.string()), Error);
}

}  // namespace
}  // namespace basalt

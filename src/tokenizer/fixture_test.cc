// Encodes and decodes the fixture strings of every tokenizer under
// testdata/tokenizers/ and compares with the ids and text that Hugging Face
// `tokenizers` produced for them (tools/fixtures/make_tokenizer_fixtures.py).
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "tokenizer/tokenizer.h"

namespace basalt {
namespace {

using nlohmann::json;

std::string dir_of(const std::string& name) {
  return std::string(BASALT_TESTDATA) + "/tokenizers/" + name;
}

json load_fixtures(const std::string& name) {
  std::ifstream in(dir_of(name) + "/fixtures.json");
  EXPECT_TRUE(in) << "missing fixtures for " << name;
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

std::string show(const std::string& s) { return json(s).dump(-1, ' ', true); }

class TokenizerFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerFixtureTest, EncodeMatchesReference) {
  Tokenizer tok = Tokenizer::from_file(dir_of(GetParam()) + "/tokenizer.json");
  json fx = load_fixtures(GetParam());
  ASSERT_GE(fx["encode"].size(), 60u);
  for (const json& c : fx["encode"]) {
    std::string text = c["text"];
    EXPECT_EQ(tok.encode(text, true), c["ids"].get<std::vector<int32_t>>())
        << "text " << show(text);
    EXPECT_EQ(tok.encode(text, false), c["ids_no_special"].get<std::vector<int32_t>>())
        << "text " << show(text);
  }
}

TEST_P(TokenizerFixtureTest, DecodeMatchesReference) {
  Tokenizer tok = Tokenizer::from_file(dir_of(GetParam()) + "/tokenizer.json");
  json fx = load_fixtures(GetParam());
  for (const json& c : fx["encode"]) {
    auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.decode(ids, false), c["decoded"].get<std::string>())
        << "text " << show(c["text"]);
    EXPECT_EQ(tok.decode(ids, true), c["decoded_skip_special"].get<std::string>())
        << "text " << show(c["text"]);
  }
  for (const json& c : fx["decode"]) {
    auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.decode(ids, false), c["decoded"].get<std::string>()) << "ids " << c["ids"].dump();
    EXPECT_EQ(tok.decode(ids, true), c["decoded_skip_special"].get<std::string>())
        << "ids " << c["ids"].dump();
  }
}

TEST_P(TokenizerFixtureTest, VocabularyQueries) {
  Tokenizer tok = Tokenizer::from_file(dir_of(GetParam()) + "/tokenizer.json");
  json fx = load_fixtures(GetParam());
  EXPECT_EQ(tok.vocab_size(), fx["max_id_plus_one"].get<int32_t>());
  EXPECT_EQ(tok.special_ids(), fx["special_ids"].get<std::vector<int32_t>>());
  for (const auto& [content, id] : fx["token_ids"].items()) {
    ASSERT_EQ(tok.token_to_id(content), std::optional<int32_t>(id.get<int32_t>())) << content;
    EXPECT_EQ(tok.id_to_token(id.get<int32_t>()), content);
  }
  for (int32_t id : fx["special_ids"].get<std::vector<int32_t>>()) EXPECT_TRUE(tok.is_special(id));
}

// One Tokenizer serves many threads at once (the BPE cache is shared).
TEST_P(TokenizerFixtureTest, ConcurrentEncodingIsConsistent) {
  Tokenizer tok = Tokenizer::from_file(dir_of(GetParam()) + "/tokenizer.json");
  json fx = load_fixtures(GetParam());
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 5; ++round) {
        for (const json& c : fx["encode"]) {
          if (tok.encode(c["text"].get<std::string>(), true) !=
              c["ids"].get<std::vector<int32_t>>())
            ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(TokenizerBosTest, BosComesFromThePostProcessor) {
  Tokenizer llama3 = Tokenizer::from_file(dir_of("llama3") + "/tokenizer.json");
  EXPECT_EQ(llama3.bos_id(), llama3.token_to_id("<|begin_of_text|>"));
  Tokenizer llama2 = Tokenizer::from_file(dir_of("llama2") + "/tokenizer.json");
  EXPECT_EQ(llama2.bos_id(), std::optional<int32_t>(1));
  EXPECT_FALSE(Tokenizer::from_file(dir_of("gpt2") + "/tokenizer.json").bos_id().has_value());
  EXPECT_FALSE(Tokenizer::from_file(dir_of("misc") + "/tokenizer.json").bos_id().has_value());
  // Without special tokens the post-processor adds nothing.
  EXPECT_EQ(llama3.encode("", true), std::vector<int32_t>{*llama3.bos_id()});
  EXPECT_TRUE(llama3.encode("", false).empty());
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, TokenizerFixtureTest,
                         ::testing::Values("gpt2", "llama3", "qwen2", "deepseek_v3", "llama2",
                                           "mistral", "metaspace_split", "misc", "added_options",
                                           "normalizers", "unk_whitespace"));

}  // namespace
}  // namespace basalt

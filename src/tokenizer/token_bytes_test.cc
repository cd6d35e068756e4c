// Tokenizer::token_bytes: the bytes of a stream's tokens, put together, are
// the text decode() gives for it (up to the leading space some decoders drop
// at the stream's start), on every fixture tokenizer and the fixture texts
// that Hugging Face `tokenizers` encoded.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/tokenizer.h"

namespace basalt {
namespace {

std::string dir_of(const std::string& name) { return std::string(BASALT_TESTDATA) + "/tokenizers/" + name; }

class TokenBytesTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenBytesTest, ConcatenatedTokenBytesAreTheDecodedText) {
  const Tokenizer tok = Tokenizer::from_file(dir_of(GetParam()) + "/tokenizer.json");
  std::ifstream in(dir_of(GetParam()) + "/fixtures.json");
  ASSERT_TRUE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json fx = nlohmann::json::parse(ss.str());
  int checked = 0;
  for (const nlohmann::json& c : fx["encode"]) {
    const std::vector<int32_t> ids = tok.encode(c["text"].get<std::string>(), /*add_special_tokens=*/false);
    std::string joined;
    bool special = false;
    for (int32_t id : ids) {
      special |= tok.is_special(id);
      joined += tok.token_bytes(id).value();
    }
    if (special) continue;  // decode's treatment of added tokens is not per token
    const std::string decoded = tok.decode(ids, /*skip_special_tokens=*/false);
    if (decoded.find("\xEF\xBF\xBD") != std::string::npos) continue;  // lossy: bytes differ by design
    EXPECT_TRUE(joined == decoded || joined == " " + decoded)
        << GetParam() << ": " << nlohmann::json(joined).dump() << " vs " << nlohmann::json(decoded).dump();
    ++checked;
  }
  EXPECT_GE(checked, 20);
  EXPECT_FALSE(tok.token_bytes(tok.vocab_size()).has_value());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenBytesTest,
                         ::testing::Values("gpt2", "llama2", "llama3", "mistral", "qwen2", "deepseek_v3",
                                           "metaspace_split"));

TEST(TokenBytes, ByteTokensStayRawBytes) {
  // A byte-level token that is half of "é" and a SentencePiece <0xNN> byte
  // token give the raw byte, not U+FFFD.
  const Tokenizer gpt2 = Tokenizer::from_file(dir_of("gpt2") + "/tokenizer.json");
  const std::optional<int32_t> half = gpt2.token_to_id("\xC3\x83");  // Ã: the byte 0xC3
  ASSERT_TRUE(half.has_value());
  EXPECT_EQ(gpt2.token_bytes(*half).value(), "\xC3");
  const Tokenizer llama2 = Tokenizer::from_file(dir_of("llama2") + "/tokenizer.json");
  const std::optional<int32_t> byte = llama2.token_to_id("<0xE4>");
  ASSERT_TRUE(byte.has_value());
  EXPECT_EQ(llama2.token_bytes(*byte).value(), "\xE4");
  const std::optional<int32_t> word = llama2.token_to_id("\xE2\x96\x81the");
  if (word) {
    EXPECT_EQ(llama2.token_bytes(*word).value(), " the");
  }
}

}  // namespace
}  // namespace basalt

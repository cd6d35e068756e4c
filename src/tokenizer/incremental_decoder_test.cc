#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace basalt {
namespace {

Tokenizer load(const std::string& name) {
  return Tokenizer::from_file(std::string(BASALT_TESTDATA) + "/tokenizers/" + name +
                              "/tokenizer.json");
}

// Streams ids through an IncrementalDecoder and checks every piece.
std::string stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  IncrementalDecoder dec(tok, skip);
  std::string out;
  for (int32_t id : ids) {
    std::string piece = dec.push(id);
    EXPECT_EQ(unicode::find_invalid_utf8(piece), std::string::npos);
    EXPECT_FALSE(piece.ends_with("\xEF\xBF\xBD")) << "a held-back character was emitted";
    out += piece;
  }
  return out + dec.flush();
}

class TokenizerIncrementalDecoderTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerIncrementalDecoderTest, RandomIdsConcatenateToFullDecode) {
  Tokenizer tok = load(GetParam());
  std::mt19937 rng(42);
  std::vector<int32_t> specials = tok.special_ids();
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> ids(1 + rng() % 40);
    for (int32_t& id : ids) {
      // Mostly ordinary tokens, some specials, and runs of low ids (the byte
      // tokens of byte-fallback vocabularies and the byte alphabet of byte-level ones).
      uint32_t kind = rng() % 10;
      if (kind == 0 && !specials.empty()) {
        id = specials[rng() % specials.size()];
      } else if (kind < 5) {
        id = static_cast<int32_t>(rng() % 260);
      } else {
        id = static_cast<int32_t>(rng() % tok.vocab_size());
      }
    }
    for (bool skip : {false, true}) {
      ASSERT_EQ(stream(tok, ids, skip), tok.decode(ids, skip))
          << "trial " << trial << " skip " << skip;
    }
  }
}

TEST_P(TokenizerIncrementalDecoderTest, EncodedTextStreamsBack) {
  Tokenizer tok = load(GetParam());
  for (const char* text :
       {"Hello world, this is a test.",
        "emoji 😀 family 👨‍👩‍👧‍👦 flags 🇺🇸 done",
        "日本語のテキスト and Привет мир\n\n  spaces\t", "  leading and trailing  "}) {
    std::vector<int32_t> ids = tok.encode(text, true);
    EXPECT_EQ(stream(tok, ids, true), tok.decode(ids, true)) << text;
    EXPECT_EQ(stream(tok, ids, false), tok.decode(ids, false)) << text;
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, TokenizerIncrementalDecoderTest,
                         ::testing::Values("gpt2", "llama3", "qwen2", "deepseek_v3", "llama2",
                                           "mistral", "metaspace_split", "misc", "added_options",
                                           "normalizers", "unk_whitespace"));

TEST(TokenizerIncrementalDecoderSingleTest, HoldsBackSplitEmojiUntilComplete) {
  Tokenizer tok = load("llama2");
  // The emoji is not in the vocabulary, so it is spelled with four byte tokens.
  std::vector<int32_t> ids = tok.encode("a\U0001F600b", false);
  std::vector<int32_t> bytes;
  for (int32_t id : ids) {
    if (tok.id_to_token(id).starts_with("<0x")) bytes.push_back(id);
  }
  ASSERT_EQ(bytes.size(), 4u);
  IncrementalDecoder dec(tok, false);
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(dec.push(id));
  std::string all;
  for (const std::string& p : pieces) {
    all += p;
    // No piece holds part of the emoji.
    EXPECT_TRUE(p.find("\U0001F600") != std::string::npos || p.find('\xF0') == std::string::npos);
  }
  all += dec.flush();
  EXPECT_EQ(all, "a\U0001F600b");
  EXPECT_TRUE(std::any_of(pieces.begin(), pieces.end(), [](const std::string& p) {
    return p.find("\U0001F600") != std::string::npos;
  }));
}

TEST(TokenizerIncrementalDecoderSingleTest, FlushEmitsIncompleteBytesLikeDecode) {
  Tokenizer tok = load("gpt2");
  // The first two bytes of U+20AC (E2 82), each a byte-level token.
  std::vector<int32_t> ids = {*tok.token_to_id("\u00e2"), *tok.token_to_id("\u0124")};
  IncrementalDecoder dec(tok, false);
  EXPECT_EQ(dec.push(ids[0]), "");
  EXPECT_EQ(dec.push(ids[1]), "");
  EXPECT_EQ(dec.flush(), tok.decode(ids, false));
  EXPECT_EQ(dec.flush(), "");  // the decoder was reset
}

TEST(TokenizerIncrementalDecoderSingleTest, RejectsUnknownIds) {
  Tokenizer tok = load("gpt2");
  IncrementalDecoder dec(tok, false);
  EXPECT_THROW(dec.push(tok.vocab_size()), Error);
  EXPECT_THROW(dec.push(-1), Error);
}

}  // namespace
}  // namespace basalt

#include "tokenizer/regex.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"

namespace basalt {
namespace {

// The matched substrings, left to right.
std::vector<std::string> all(const std::string& pattern, const std::string& text) {
  std::vector<std::string> out;
  for (const Regex::Span& s : Regex::compile(pattern).find_all(text))
    out.push_back(text.substr(s.begin, s.end - s.begin));
  return out;
}

using V = std::vector<std::string>;

const char kGpt2[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char kLlama3[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

TEST(TokenizerRegexTest, Gpt2Pattern) {
  EXPECT_EQ(all(kGpt2, "Hello world, it's 2024!"),
            (V{"Hello", " world", ",", " it", "'s", " 2024", "!"}));
  // \s+(?!\S) leaves the last space to the following word.
  EXPECT_EQ(all(kGpt2, "a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(all(kGpt2, "a  \n\n  "), (V{"a", "  \n\n  "}));
  // Case-sensitive: 'M is no contraction here, the quote stands alone.
  EXPECT_EQ(all(kGpt2, "I'M"), (V{"I", "'", "M"}));
}

TEST(TokenizerRegexTest, Llama3Pattern) {
  EXPECT_EQ(all(kLlama3, "I'M don't WE'LL"), (V{"I", "'M", " don", "'t", " WE", "'LL"}));
  EXPECT_EQ(all(kLlama3, "1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(all(kLlama3, "x\r\n\r\ny"), (V{"x", "\r\n\r\n", "y"}));
  EXPECT_EQ(all(kLlama3, "...!!!\n\nnext"), (V{"...!!!\n\n", "next"}));
  EXPECT_EQ(all(kLlama3, "$hello"), (V{"$hello"}));
  // The long s folds to s, as in Oniguruma.
  EXPECT_EQ(all(kLlama3, "it'\u017f"), (V{"it", "'\u017f"}));
}

TEST(TokenizerRegexTest, DeepSeekPatterns) {
  EXPECT_EQ(all("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+", "abc日本語のテキストxyz"),
            (V{"日本語のテキスト"}));
  const char* punct =
      R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  EXPECT_EQ(all(punct, ".net e\u0301t\u00e9 ++\n"), (V{".net", " e\u0301t\u00e9", " ++\n"}));
  EXPECT_EQ(all(punct, "\\x [y]"), (V{"\\x", " [", "y", "]"}));
}

TEST(TokenizerRegexTest, LeftmostFirstAlternation) {
  EXPECT_EQ(all("a|ab", "ab"), (V{"a"}));
  EXPECT_EQ(all("ab|a", "ab"), (V{"ab"}));
  EXPECT_EQ(all("(?:a|ab)c", "abc"), (V{"abc"}));  // backtracks into the second branch
}

TEST(TokenizerRegexTest, Quantifiers) {
  EXPECT_EQ(all("a{2}", "aaaaa"), (V{"aa", "aa"}));
  EXPECT_EQ(all("a{2,}", "aaaaa"), (V{"aaaaa"}));
  EXPECT_EQ(all("a{1,2}?", "aaa"), (V{"a", "a", "a"}));
  EXPECT_EQ(all("a+?b", "aaab"), (V{"aaab"}));
  EXPECT_EQ(all("(?:ab)+", "ababxab"), (V{"abab", "ab"}));
  EXPECT_EQ(all("ax{,2}", "axxxa"), (V{"axx", "a"}));
  EXPECT_EQ(all("x{a}", "x{a}"), (V{"x{a}"}));  // a brace that starts no interval is literal
}

TEST(TokenizerRegexTest, EmptyMatchesFollowOnigurumaFindIter) {
  EXPECT_EQ(Regex::compile("x*").find_all("abc"),
            (std::vector<Regex::Span>{{0, 0}, {1, 1}, {2, 2}, {3, 3}}));
  // No empty match right after the previous match.
  EXPECT_EQ(Regex::compile("a*").find_all("aab"), (std::vector<Regex::Span>{{0, 2}, {3, 3}}));
}

TEST(TokenizerRegexTest, ClassesAndEscapes) {
  EXPECT_EQ(all(R"([^\s\p{L}]+)", "ab 12,3 cd"), (V{"12,3"}));
  EXPECT_EQ(all(R"(\P{L}+)", "ab 12cd"), (V{" 12"}));
  EXPECT_EQ(all(R"(\p{Lu}\p{Ll}*)", "HelloWorld"), (V{"Hello", "World"}));
  EXPECT_EQ(all(R"(\x{1F600}|\u00e9|\x41)", "A\u00e9\U0001F600"), (V{"A", "\u00e9", "\U0001F600"}));
  EXPECT_EQ(all(R"([a\-z]+)", "a-zb"), (V{"a-z"}));
  EXPECT_EQ(all(R"(\d+)", "x\u0663\u0664y12"), (V{"\u0663\u0664", "12"}));
  EXPECT_EQ(all(R"(\w+)", "h\u00e9_1 \u0301x"), (V{"h\u00e9_1", "\u0301x"}));
  EXPECT_EQ(all(".", "a\nb"), (V{"a", "b"}));
  EXPECT_EQ(all("(?i)[a-c]+", "xAbCx"), (V{"AbC"}));
  EXPECT_EQ(all("(?i:k)", "K\u212Ak"), (V{"K", "\u212A", "k"}));
}

TEST(TokenizerRegexTest, UnicodeWhiteSpace) {
  const std::string spaces =
      "\t\n\v\f\r \u0085\u00a0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000";
  EXPECT_EQ(all(R"(\s+)", spaces), (V{spaces}));
  EXPECT_TRUE(all(R"(\s)", "\u200b\u180e").empty());
}

TEST(TokenizerRegexTest, AnchorsAndLookahead) {
  EXPECT_EQ(all("^a", "a\na ba"), (V{"a", "a"}));
  EXPECT_EQ(all("a$", "a\nba"), (V{"a", "a"}));
  EXPECT_EQ(all(R"(\Aa)", "aa"), (V{"a"}));
  EXPECT_EQ(all(R"(a\z)", "aa"), (V{"a"}));
  EXPECT_EQ(all("a(?=b)", "acab"), (V{"a"}));
  EXPECT_EQ(Regex::compile("a(?=b)").find("acab")->begin, 2u);
}

TEST(TokenizerRegexTest, LiteralEscapesMetacharacters) {
  EXPECT_EQ(Regex::literal("a.b*").find_all("a.b*axb"), (std::vector<Regex::Span>{{0, 4}}));
  EXPECT_EQ(Regex::literal("\u2581").find_all("\u2581x\u2581"),
            (std::vector<Regex::Span>{{0, 3}, {4, 7}}));
}

TEST(TokenizerRegexTest, RejectsUnsupportedSyntax) {
  for (const char* bad : {"(", "a)", "[a", "a{2,1}", R"(\p{Han})", "(?<=a)b", "a++", R"(\1)",
                          "[[a]]", "*a", R"(\x{110000})", "(?m)a", "[b-a]", R"(\)", "[a&&b]"}) {
    try {
      Regex::compile(bad);
      ADD_FAILURE() << "compiled: " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(TokenizerRegexTest, DeepBacktrackingFailsCleanly) {
  std::string text;
  for (int i = 0; i < 100000; ++i) text += "ab";
  EXPECT_THROW(Regex::compile("(?:ab)+").find_all(text), Error);
  // Repeats of single characters never recurse, whatever the input length.
  EXPECT_EQ(Regex::compile(R"(\p{L}+)").find_all(text).size(), 1u);
}

}  // namespace
}  // namespace basalt

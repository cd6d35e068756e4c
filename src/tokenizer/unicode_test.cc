#include "tokenizer/unicode.h"

#include <gtest/gtest.h>

#include <string>

namespace basalt::unicode {
namespace {

TEST(TokenizerUnicodeTest, GeneralCategories) {
  EXPECT_EQ(category('a'), Category::kLl);
  EXPECT_EQ(category('A'), Category::kLu);
  EXPECT_EQ(category('5'), Category::kNd);
  EXPECT_EQ(category(U'\u00bd'), Category::kNo);
  EXPECT_EQ(category(U'\u2167'), Category::kNl);  // ROMAN NUMERAL EIGHT
  EXPECT_EQ(category(U'\u4e2d'), Category::kLo);
  EXPECT_EQ(category(U'\u0301'), Category::kMn);
  EXPECT_EQ(category(U'\u0903'), Category::kMc);
  EXPECT_EQ(category('-'), Category::kPd);
  EXPECT_EQ(category('$'), Category::kSc);
  EXPECT_EQ(category(U'\U0001F600'), Category::kSo);
  EXPECT_EQ(category(U'\U0001D518'), Category::kLu);  // MATHEMATICAL FRAKTUR CAPITAL U
  EXPECT_EQ(category(U'\u200d'), Category::kCf);
  EXPECT_EQ(category(U'\ue000'), Category::kCo);
  EXPECT_EQ(category(0x10FFFF), Category::kCn);
  EXPECT_EQ(category(0x110000), Category::kCn);
  EXPECT_TRUE(in_categories(U'\u00e9', kLetterMask));
  EXPECT_TRUE(in_categories(U'\u3001', kPunctuationMask));
  EXPECT_TRUE(is_numeric(U'\u0663'));
  EXPECT_FALSE(is_numeric('x'));
}

TEST(TokenizerUnicodeTest, WhiteSpaceIsTheUnicodeProperty) {
  for (char32_t c : {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x2005, 0x200A,
                     0x2028, 0x2029, 0x202F, 0x205F, 0x3000}) {
    EXPECT_TRUE(is_white_space(c)) << std::hex << static_cast<uint32_t>(c);
  }
  for (char32_t c : {0x200B, 0x180E, 0xFEFF, 0x1C, 0x61}) EXPECT_FALSE(is_white_space(c));
}

TEST(TokenizerUnicodeTest, CombiningClasses) {
  EXPECT_EQ(combining_class('a'), 0);
  EXPECT_EQ(combining_class(U'\u0301'), 230);
  EXPECT_EQ(combining_class(U'\u0316'), 220);
  EXPECT_EQ(combining_class(U'\u05b0'), 10);
}

TEST(TokenizerUnicodeTest, NormalizersSeeUnicode9) {
  // U+1DFA (ccc 218) arrived in Unicode 14: `tokenizers`' normalizers treat
  // it as an unknown starter, so it blocks nothing and is never reordered.
  EXPECT_EQ(combining_class(U'\u1dfa'), 0);
  EXPECT_EQ(normalize("a\u0301\u1dfa", NormalForm::kNFD), "a\u0301\u1dfa");
  EXPECT_TRUE(is_normalizer_mark(U'\u0301'));
  EXPECT_FALSE(is_normalizer_mark(U'\U00010F46'));       // Sogdian mark, Unicode 11
  EXPECT_TRUE(in_categories(U'\U00010F46', kMarkMask));  // the regexes know it
  EXPECT_TRUE(is_normalizer_mark(U'\u1cf2'));            // a mark in 9.0, a letter since
}

TEST(TokenizerUnicodeTest, Normalization) {
  EXPECT_EQ(normalize("e\u0301", NormalForm::kNFC), "\u00e9");
  EXPECT_EQ(normalize("\u00e9", NormalForm::kNFD), "e\u0301");
  EXPECT_EQ(normalize("\ufb01 \u2460 \uff21", NormalForm::kNFKC), "fi 1 A");
  EXPECT_EQ(normalize("\ufb01", NormalForm::kNFC), "\ufb01");
  EXPECT_EQ(normalize("\u1e9b\u0323", NormalForm::kNFKD), "s\u0323\u0307");
  // Canonical ordering puts ccc 220 before ccc 230.
  EXPECT_EQ(normalize("a\u0301\u0316", NormalForm::kNFD), "a\u0316\u0301");
  EXPECT_EQ(normalize("a\u0301\u0316", NormalForm::kNFC), "\u00e1\u0316");
  // Hangul composes and decomposes algorithmically.
  EXPECT_EQ(normalize("\ud55c", NormalForm::kNFD), "\u1112\u1161\u11ab");
  EXPECT_EQ(normalize("\u1112\u1161\u11ab", NormalForm::kNFC), "\ud55c");
  // Composition exclusions stay decomposed.
  EXPECT_EQ(normalize("\u0958", NormalForm::kNFC), "\u0915\u093c");
  // Singletons map to their canonical equivalent.
  EXPECT_EQ(normalize("\u212b", NormalForm::kNFC), "\u00c5");
  EXPECT_EQ(normalize("plain ascii", NormalForm::kNFKC), "plain ascii");
}

TEST(TokenizerUnicodeTest, Lowercase) {
  auto lower = [](std::string_view s) {
    std::string out;
    size_t pos = 0;
    char32_t c;
    while (decode_utf8(s, pos, c)) append_lowercase(c, out);
    return out;
  };
  EXPECT_EQ(lower("HeLLo \u00c9\u03a3\u1e9e"), "hello \u00e9\u03c3\u00df");
  EXPECT_EQ(lower("\u0130"), "i\u0307");  // full mapping: two code points
  EXPECT_EQ(simple_fold('S'), U's');
  EXPECT_EQ(simple_fold(0x17F), U's');
  EXPECT_EQ(simple_fold(0x212A), U'k');
}

TEST(TokenizerUnicodeTest, Utf8DecodeRejectsInvalidSequences) {
  auto valid = [](std::string_view s) { return find_invalid_utf8(s) == std::string_view::npos; };
  EXPECT_TRUE(valid("a\u00e9\u4e2d\U0001F600"));
  EXPECT_FALSE(valid("\xC0\x80"));          // overlong
  EXPECT_FALSE(valid("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(valid("\xF4\x90\x80\x80"));  // beyond U+10FFFF
  EXPECT_FALSE(valid("\xE2\x82"));          // truncated
  EXPECT_EQ(find_invalid_utf8("ab\xFF"), 2u);
  std::string out;
  append_utf8(0x1F600, out);
  EXPECT_EQ(out, "\U0001F600");
}

TEST(TokenizerUnicodeTest, LossyMatchesRustFromUtf8Lossy) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_lossy("ok"), "ok");
  EXPECT_EQ(utf8_lossy("\xE2\x82"), r);  // one maximal subpart
  EXPECT_EQ(utf8_lossy("\xE2\x82"
                       "a"),
            r + "a");
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"
                       "\xF0\x9F\x98\x80"),
            r + "\U0001F600");
  EXPECT_EQ(utf8_lossy("\xC0\x80"), r + r);          // C0 is never valid
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), r + r + r);  // surrogates: each byte alone
  EXPECT_EQ(utf8_lossy("\x80\x80"), r + r);
}

}  // namespace
}  // namespace basalt::unicode

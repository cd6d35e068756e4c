#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <memory>
#include <span>

#include "tokenizer/unicode_tables.h"

namespace basalt::unicode {
namespace tables = unicode_tables;

namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;

// Hangul syllables compose and decompose algorithmically (Unicode 3.12).
constexpr char32_t kHangulSBase = 0xAC00, kHangulLBase = 0x1100, kHangulVBase = 0x1161,
                   kHangulTBase = 0x11A7;
constexpr char32_t kHangulLCount = 19, kHangulVCount = 21, kHangulTCount = 28;
constexpr char32_t kHangulNCount = kHangulVCount * kHangulTCount;
constexpr char32_t kHangulSCount = kHangulLCount * kHangulNCount;

// Categories of the Basic Multilingual Plane, expanded once from the range
// table because the regex engine asks for them on every character.
const std::array<uint8_t, 0x10000>& bmp_categories() {
  static const auto table = [] {
    auto t = std::make_unique<std::array<uint8_t, 0x10000>>();
    for (size_t i = 0; i < tables::kCategoryRangesSize; ++i) {
      uint32_t start = tables::kCategoryRanges[i].start;
      if (start >= 0x10000) break;
      uint32_t end =
          i + 1 < tables::kCategoryRangesSize ? tables::kCategoryRanges[i + 1].start : 0x110000;
      std::fill(t->begin() + start, t->begin() + std::min<uint32_t>(end, 0x10000),
                tables::kCategoryRanges[i].category);
    }
    return t;
  }();
  return *table;
}

std::span<const char32_t> lookup_mapping(const tables::MappingEntry* entries, size_t size,
                                         const char32_t* data, char32_t cp) {
  const tables::MappingEntry* end = entries + size;
  const tables::MappingEntry* it = std::lower_bound(
      entries, end, cp, [](const tables::MappingEntry& e, char32_t c) { return e.code_point < c; });
  if (it == end || it->code_point != cp) return {};
  return {data + it->offset, it->length};
}

void decompose(char32_t cp, bool compat, std::u32string& out) {
  if (cp >= kHangulSBase && cp < kHangulSBase + kHangulSCount) {
    char32_t s = cp - kHangulSBase;
    out.push_back(kHangulLBase + s / kHangulNCount);
    out.push_back(kHangulVBase + (s % kHangulNCount) / kHangulTCount);
    if (s % kHangulTCount != 0) out.push_back(kHangulTBase + s % kHangulTCount);
    return;
  }
  if (compat) {
    auto m = lookup_mapping(tables::kCompatDecomposition, tables::kCompatDecomposition_size,
                            tables::kCompatDecomposition_data, cp);
    if (!m.empty()) {
      out.append(m.begin(), m.end());
      return;
    }
  }
  auto m = lookup_mapping(tables::kCanonicalDecomposition, tables::kCanonicalDecomposition_size,
                          tables::kCanonicalDecomposition_data, cp);
  if (!m.empty()) {
    out.append(m.begin(), m.end());
  } else {
    out.push_back(cp);
  }
}

// The primary composite of a + b, or 0 when there is none.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kHangulLBase && a < kHangulLBase + kHangulLCount && b >= kHangulVBase &&
      b < kHangulVBase + kHangulVCount) {
    return kHangulSBase + ((a - kHangulLBase) * kHangulVCount + (b - kHangulVBase)) * kHangulTCount;
  }
  if (a >= kHangulSBase && a < kHangulSBase + kHangulSCount &&
      (a - kHangulSBase) % kHangulTCount == 0 && b > kHangulTBase &&
      b < kHangulTBase + kHangulTCount) {
    return a + (b - kHangulTBase);
  }
  const tables::CompositionEntry* begin = tables::kCompositions;
  const tables::CompositionEntry* end = begin + tables::kCompositionsSize;
  const tables::CompositionEntry* it = std::lower_bound(
      begin, end, std::pair<char32_t, char32_t>(a, b),
      [](const tables::CompositionEntry& e, std::pair<char32_t, char32_t> key) {
        return e.first < key.first || (e.first == key.first && e.second < key.second);
      });
  if (it != end && it->first == a && it->second == b) return it->composite;
  return 0;
}

void canonical_order(std::u32string& s) {
  size_t i = 0;
  while (i < s.size()) {
    if (combining_class(s[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && combining_class(s[j]) != 0) ++j;
    std::stable_sort(s.begin() + i, s.begin() + j, [](char32_t a, char32_t b) {
      return combining_class(a) < combining_class(b);
    });
    i = j;
  }
}

void canonical_compose(std::u32string& s) {
  std::u32string out;
  out.reserve(s.size());
  size_t starter = std::u32string::npos;
  for (char32_t c : s) {
    uint8_t cc = combining_class(c);
    if (starter != std::u32string::npos) {
      bool adjacent = out.size() - 1 == starter;
      uint8_t last_cc = combining_class(out.back());
      bool blocked = !adjacent && (last_cc == 0 || last_cc >= cc);
      if (!blocked) {
        if (char32_t composite = compose(out[starter], c)) {
          out[starter] = composite;
          continue;
        }
      }
    }
    if (cc == 0) starter = out.size();
    out.push_back(c);
  }
  s.swap(out);
}

}  // namespace

const char* unicode_version() { return tables::kUnicodeVersion; }

Category category(char32_t cp) {
  if (cp < 0x10000) return static_cast<Category>(bmp_categories()[cp]);
  if (cp > kMaxCodePoint) return Category::kCn;
  const tables::CategoryRange* begin = tables::kCategoryRanges;
  const tables::CategoryRange* end = begin + tables::kCategoryRangesSize;
  const tables::CategoryRange* it = std::upper_bound(
      begin, end, cp, [](char32_t c, const tables::CategoryRange& r) { return c < r.start; });
  return static_cast<Category>((it - 1)->category);
}

bool is_white_space(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  const tables::CombiningRange* begin = tables::kCombiningRanges;
  const tables::CombiningRange* end = begin + tables::kCombiningRangesSize;
  const tables::CombiningRange* it = std::upper_bound(
      begin, end, cp, [](char32_t c, const tables::CombiningRange& r) { return c < r.first; });
  if (it == begin) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

bool is_normalizer_mark(char32_t cp) {
  if (cp < 0x300) return false;
  const tables::CodePointRange* begin = tables::kNormalizerMarkRanges;
  const tables::CodePointRange* end = begin + tables::kNormalizerMarkRangesSize;
  const tables::CodePointRange* it = std::upper_bound(
      begin, end, cp, [](char32_t c, const tables::CodePointRange& r) { return c < r.first; });
  return it != begin && cp <= (it - 1)->last;
}

std::string normalize(std::string_view text, NormalForm form) {
  bool compat = form == NormalForm::kNFKC || form == NormalForm::kNFKD;
  bool composed = form == NormalForm::kNFC || form == NormalForm::kNFKC;
  // ASCII is invariant under every normal form.
  if (std::all_of(text.begin(), text.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
    return std::string(text);
  }
  std::u32string decomposed;
  decomposed.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t cp;
    if (!decode_utf8(text, pos, cp)) {
      cp = kReplacementChar;
      ++pos;
    }
    decompose(cp, compat, decomposed);
  }
  canonical_order(decomposed);
  if (composed) canonical_compose(decomposed);
  std::string out;
  out.reserve(text.size());
  for (char32_t c : decomposed) append_utf8(c, out);
  return out;
}

void append_lowercase(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
    return;
  }
  auto m = lookup_mapping(tables::kLowercase, tables::kLowercase_size, tables::kLowercase_data, cp);
  if (m.empty()) {
    append_utf8(cp, out);
  } else {
    for (char32_t c : m) append_utf8(c, out);
  }
}

char32_t simple_fold(char32_t cp) {
  if (cp < 0x80) return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
  if (cp == 0x17F) return 's';
  if (cp == 0x212A) return 'k';
  auto m = lookup_mapping(tables::kLowercase, tables::kLowercase_size, tables::kLowercase_data, cp);
  return m.size() == 1 ? m[0] : cp;
}

size_t utf8_sequence_length(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 1;
}

size_t utf8_valid_prefix(std::string_view text, size_t pos, bool& complete) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[pos + i]); };
  unsigned char b0 = byte(0);
  complete = false;
  if (b0 < 0x80) {
    complete = true;
    return 1;
  }
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  size_t have = 1;
  while (have < need && pos + have < text.size()) {
    unsigned char b = byte(have);
    unsigned char l = have == 1 ? lo : 0x80, h = have == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
    ++have;
  }
  complete = have == need;
  return have;
}

bool decode_utf8(std::string_view text, size_t& pos, char32_t& cp) {
  if (pos >= text.size()) return false;
  bool complete;
  size_t n = utf8_valid_prefix(text, pos, complete);
  if (!complete) return false;
  auto b = [&](size_t i) {
    return static_cast<char32_t>(static_cast<unsigned char>(text[pos + i]));
  };
  switch (n) {
    case 1:
      cp = b(0);
      break;
    case 2:
      cp = ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
      break;
    case 3:
      cp = ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
      break;
    default:
      cp = ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
      break;
  }
  pos += n;
  return true;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t find_invalid_utf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    bool complete;
    size_t n = utf8_valid_prefix(text, pos, complete);
    if (!complete) return pos;
    pos += n;
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    bool complete;
    size_t n = utf8_valid_prefix(bytes, pos, complete);
    if (complete) {
      out.append(bytes.substr(pos, n));
      pos += n;
    } else {
      append_utf8(kReplacementChar, out);
      pos += std::max<size_t>(n, 1);
    }
  }
  return out;
}

}  // namespace basalt::unicode

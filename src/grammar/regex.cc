#include "grammar/regex.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "grammar/ebnf.h"
#include "tokenizer/unicode.h"

namespace basalt {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kSurrogateFirst = 0xD800;
constexpr uint32_t kSurrogateLast = 0xDFFF;
// What the parser sees past the last code point (no code point has it).
constexpr uint32_t kEndOfPattern = 0xFFFFFFFF;
// Each group level costs a few stack frames here and in the EBNF parser;
// patterns come from requests, so a hostile one must not exhaust the stack.
constexpr int kMaxGroupNesting = 200;

// Inclusive code point ranges. Normalized: sorted, disjoint, not adjacent,
// and free of surrogates (no UTF-8 text contains one, and the EBNF dialect
// refuses them in classes).
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges normalize(Ranges ranges) {
  std::sort(ranges.begin(), ranges.end());
  Ranges merged;
  for (const auto& [lo, hi] : ranges) {
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.emplace_back(lo, hi);
    }
  }
  Ranges out;
  for (const auto& [lo, hi] : merged) {
    if (hi < kSurrogateFirst || lo > kSurrogateLast) {
      out.emplace_back(lo, hi);
      continue;
    }
    if (lo < kSurrogateFirst) out.emplace_back(lo, kSurrogateFirst - 1);
    if (hi > kSurrogateLast) out.emplace_back(kSurrogateLast + 1, hi);
  }
  return out;
}

// Over all Unicode scalar values; `ranges` normalized.
Ranges complement(const Ranges& ranges) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : ranges) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return normalize(std::move(out));
}

Ranges intersect(const Ranges& a, const Ranges& b) {
  Ranges out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint32_t lo = std::max(a[i].first, b[j].first);
    const uint32_t hi = std::min(a[i].second, b[j].second);
    if (lo <= hi) out.emplace_back(lo, hi);
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}

const Ranges& digit_set() {
  static const Ranges set = {{'0', '9'}};
  return set;
}

const Ranges& word_set() {
  static const Ranges set = normalize({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}});
  return set;
}

// ECMAScript's WhiteSpace and LineTerminator productions.
const Ranges& space_set() {
  static const Ranges set = normalize({{0x09, 0x0D},
                                       {0x20, 0x20},
                                       {0xA0, 0xA0},
                                       {0x1680, 0x1680},
                                       {0x2000, 0x200A},
                                       {0x2028, 0x2029},
                                       {0x202F, 0x202F},
                                       {0x205F, 0x205F},
                                       {0x3000, 0x3000},
                                       {0xFEFF, 0xFEFF}});
  return set;
}

const Ranges& dot_set() {
  static const Ranges set = complement(normalize({{0x0A, 0x0A}, {0x0D, 0x0D}, {0x2028, 0x2029}}));
  return set;
}

const Ranges& any_set() {
  static const Ranges set = complement({});
  return set;
}

// The code points that JSON text never carries raw inside a string.
const Ranges& json_escaped_set() {
  static const Ranges set = normalize({{0x00, 0x1F}, {'"', '"'}, {'\\', '\\'}});
  return set;
}

// The regex as a tree. Groups leave no node of their own: they only decide
// what a quantifier applies to.
struct Node {
  enum class Kind : uint8_t { kEmpty, kChar, kSet, kSequence, kChoice, kRepeat };
  Kind kind = Kind::kEmpty;
  uint32_t code_point = 0;     // kChar
  Ranges set;                  // kSet, normalized and never empty
  std::vector<Node> children;  // kSequence, kChoice; kRepeat has one
  int32_t min = 0, max = -1;   // kRepeat; max < 0: unbounded
};

Node char_node(uint32_t code_point) {
  Node node;
  node.kind = Node::Kind::kChar;
  node.code_point = code_point;
  return node;
}

Node set_node(Ranges set) {
  Node node;
  node.kind = Node::Kind::kSet;
  node.set = std::move(set);
  return node;
}

// A sequence or choice of `children`, without the wrapper when there are
// fewer than two.
Node list_node(Node::Kind kind, std::vector<Node> children) {
  if (children.empty()) return Node{};
  if (children.size() == 1) return std::move(children[0]);
  Node node;
  node.kind = kind;
  node.children = std::move(children);
  return node;
}

struct Alternative {
  Node body;
  bool anchored_start = false;
  bool anchored_end = false;
};

// One class item or escape: a single code point, or a set (\d, \s, ...).
struct Atom {
  bool is_set = false;
  uint32_t code_point = 0;
  Ranges set;
};

Atom char_atom(uint32_t code_point) {
  Atom atom;
  atom.code_point = code_point;
  return atom;
}

Atom set_atom(Ranges set) {
  Atom atom;
  atom.is_set = true;
  atom.set = std::move(set);
  return atom;
}

bool is_hex_digit(uint32_t c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

uint32_t hex_value(uint32_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return c - 'A' + 10;
}

bool is_ascii_letter(uint32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_ascii_digit(uint32_t c) { return c >= '0' && c <= '9'; }

// Recursive descent over the pattern's code points (ECMAScript's Pattern
// grammar with the `u` flag's meaning; see regex.h for what is accepted).
class Parser {
 public:
  explicit Parser(std::string_view pattern) { decode(pattern); }

  std::vector<Alternative> parse() {
    std::vector<Alternative> alternatives;
    do {
      Alternative alternative;
      alternative.anchored_start = consume('^');
      alternative.body = parse_sequence(&alternative.anchored_end);
      alternatives.push_back(std::move(alternative));
    } while (consume('|'));
    // parse_sequence stops only at the end, `|` or `)`.
    if (!at_end()) refuse(pos_, "unbalanced ')'");
    return alternatives;
  }

 private:
  void decode(std::string_view text) {
    size_t i = 0;
    while (i < text.size()) {
      const auto lead = static_cast<uint8_t>(text[i]);
      int length = 0;
      uint32_t code_point = 0;
      if (lead < 0x80) {
        length = 1;
        code_point = lead;
      } else if (lead >= 0xC2 && lead <= 0xDF) {
        length = 2;
        code_point = lead & 0x1F;
      } else if (lead >= 0xE0 && lead <= 0xEF) {
        length = 3;
        code_point = lead & 0x0F;
      } else if (lead >= 0xF0 && lead <= 0xF4) {
        length = 4;
        code_point = lead & 0x07;
      } else {
        fail("regex: invalid UTF-8 at offset {} of the pattern", i);
      }
      BASALT_CHECK(i + length <= text.size(), "regex: truncated UTF-8 at offset {} of the pattern", i);
      for (int k = 1; k < length; ++k) {
        const auto byte = static_cast<uint8_t>(text[i + k]);
        BASALT_CHECK((byte & 0xC0) == 0x80, "regex: invalid UTF-8 at offset {} of the pattern", i);
        code_point = (code_point << 6) | (byte & 0x3F);
      }
      // Overlong forms, surrogates and values past U+10FFFF.
      static constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
      BASALT_CHECK(code_point >= kSmallest[length] && code_point <= kMaxCodePoint &&
                       (code_point < kSurrogateFirst || code_point > kSurrogateLast),
                   "regex: invalid UTF-8 at offset {} of the pattern", i);
      code_points_.push_back(code_point);
      offsets_.push_back(i);
      i += length;
    }
    offsets_.push_back(text.size());
  }

  [[noreturn]] void refuse(size_t index, std::string_view what) const {
    fail("regex: {} at offset {} of the pattern", what, offsets_[index]);
  }

  bool at_end() const { return pos_ >= code_points_.size(); }
  // The code point `ahead` places on, or kEndOfPattern.
  uint32_t peek(size_t ahead = 0) const {
    return pos_ + ahead < code_points_.size() ? code_points_[pos_ + ahead] : kEndOfPattern;
  }
  bool consume(uint32_t c) {
    if (peek() != c) return false;
    ++pos_;
    return true;
  }
  uint32_t next() { return code_points_[pos_++]; }

  // Items up to the end of the pattern, `|` or `)`. At the top level (where
  // `anchored_end` is given) a `$` right before the end or a `|` ends the
  // alternative and anchors it.
  Node parse_sequence(bool* anchored_end) {
    std::vector<Node> items;
    while (!at_end() && peek() != '|' && peek() != ')') {
      const size_t start = pos_;
      if (peek() == '$') {
        const bool ends_alternative = pos_ + 1 == code_points_.size() || code_points_[pos_ + 1] == '|';
        if (anchored_end == nullptr || !ends_alternative) {
          refuse(start, "anchor '$' not at the end of a top-level alternative");
        }
        ++pos_;
        *anchored_end = true;
        break;
      }
      Node atom = parse_atom();
      if (is_quantifier_start()) atom = parse_quantifier(std::move(atom));
      if (is_quantifier_start()) refuse(pos_, "quantifier with nothing to repeat");
      if (atom.kind != Node::Kind::kEmpty) items.push_back(std::move(atom));
    }
    return list_node(Node::Kind::kSequence, std::move(items));
  }

  bool is_quantifier_start() {
    const uint32_t c = peek();
    if (c == '*' || c == '+' || c == '?') return true;
    if (c != '{') return false;
    const size_t saved = pos_;
    const bool bounds = parse_bounds().has_value();
    pos_ = saved;
    return bounds;
  }

  // {m}, {m,} or {m,n} from `{`; nullopt when the text is not a quantifier.
  // Numbers saturate just past kMaxRepetition so that the caller reports
  // them instead of overflowing.
  std::optional<std::pair<int32_t, int32_t>> parse_bounds() {
    if (!consume('{')) return std::nullopt;
    const auto number = [this]() -> std::optional<int32_t> {
      if (!is_ascii_digit(peek())) return std::nullopt;
      int32_t value = 0;
      while (is_ascii_digit(peek())) {
        value = std::min<int32_t>(value * 10 + static_cast<int32_t>(next() - '0'), kMaxRepetition + 1);
      }
      return value;
    };
    const std::optional<int32_t> min = number();
    if (!min) return std::nullopt;
    int32_t max = *min;
    if (consume(',')) {
      const std::optional<int32_t> given = number();
      max = given ? *given : -1;
    }
    if (!consume('}')) return std::nullopt;
    return std::make_pair(*min, max);
  }

  Node parse_quantifier(Node atom) {
    const size_t start = pos_;
    int32_t min = 0, max = -1;
    if (consume('*')) {
      // {0,} as set above.
    } else if (consume('+')) {
      min = 1;
    } else if (consume('?')) {
      max = 1;
    } else {
      std::tie(min, max) = *parse_bounds();
      if (max >= 0 && min > max) refuse(start, "repetition bound {m,n} with m > n");
      if (min > kMaxRepetition || max > kMaxRepetition) {
        refuse(start, fmt::format("repetition bound past the limit of {}", kMaxRepetition));
      }
    }
    // Lazy and greedy quantifiers accept the same strings.
    consume('?');
    if (max == 0 || atom.kind == Node::Kind::kEmpty) return Node{};
    if (min == 1 && max == 1) return atom;
    Node node;
    node.kind = Node::Kind::kRepeat;
    node.min = min;
    node.max = max;
    node.children.push_back(std::move(atom));
    return node;
  }

  Node parse_atom() {
    const size_t start = pos_;
    const uint32_t c = next();
    switch (c) {
      case '(':
        return parse_group(start);
      case '[':
        return parse_class(start);
      case '.':
        return set_node(dot_set());
      case '\\': {
        Atom atom = parse_escape(start, /*in_class=*/false);
        return atom.is_set ? set_node(std::move(atom.set)) : char_node(atom.code_point);
      }
      case '^':
        refuse(start, "anchor '^' not at the start of a top-level alternative");
      case '*':
      case '+':
      case '?':
        refuse(start, "quantifier with nothing to repeat");
      case '{':
        pos_ = start;
        if (parse_bounds()) refuse(start, "quantifier with nothing to repeat");
        // Annex B reads it as a literal; other dialects read {,n} as a
        // quantifier, so the only safe reading is none.
        refuse(start, "'{' that does not start a quantifier (write \\{ for the character)");
      case ']':
        refuse(start, "unbalanced ']' (write \\] for the character)");
      case '}':
        refuse(start, "unbalanced '}' (write \\} for the character)");
      default:
        return char_node(c);
    }
  }

  Node parse_group(size_t start) {
    if (consume('?')) {
      const uint32_t kind = peek();
      if (kind == ':') {
        ++pos_;
      } else if (kind == '=' || kind == '!') {
        refuse(start, kind == '=' ? "lookahead (?=" : "negative lookahead (?!");
      } else if (kind == '<' && (peek(1) == '=' || peek(1) == '!')) {
        refuse(start, peek(1) == '=' ? "lookbehind (?<=" : "negative lookbehind (?<!");
      } else if (kind == '<') {
        ++pos_;
        parse_group_name(start);
      } else {
        refuse(start, "group modifier or flags (?...");
      }
    }
    if (++depth_ > kMaxGroupNesting) refuse(start, fmt::format("groups nested deeper than {}", kMaxGroupNesting));
    std::vector<Node> alternatives;
    do {
      alternatives.push_back(parse_sequence(/*anchored_end=*/nullptr));
    } while (consume('|'));
    if (!consume(')')) refuse(start, "unbalanced '('");
    --depth_;
    return list_node(Node::Kind::kChoice, std::move(alternatives));
  }

  // The name of (?<name>...) up to and including `>`: an identifier (ASCII
  // here, which is what schemas use).
  void parse_group_name(size_t start) {
    const auto identifier_char = [](uint32_t c, bool first) {
      return is_ascii_letter(c) || c == '_' || c == '$' || (!first && is_ascii_digit(c));
    };
    if (!identifier_char(peek(), /*first=*/true)) refuse(start, "bad group name in (?<name>");
    while (identifier_char(peek(), /*first=*/false)) ++pos_;
    if (!consume('>')) refuse(start, "bad group name in (?<name>");
  }

  Node parse_class(size_t start) {
    const bool negated = consume('^');
    Ranges ranges;
    while (true) {
      if (at_end()) refuse(start, "unbalanced '['");
      if (consume(']')) break;
      const size_t first_start = pos_;
      Atom first = parse_class_atom();
      if (peek() == '-' && peek(1) != kEndOfPattern && peek(1) != ']') {
        ++pos_;
        Atom last = parse_class_atom();
        if (first.is_set || last.is_set) refuse(first_start, "class escape (\\d, \\w, \\s, ...) as a range bound");
        if (first.code_point > last.code_point) refuse(first_start, "class range out of order");
        ranges.emplace_back(first.code_point, last.code_point);
      } else if (first.is_set) {
        ranges.insert(ranges.end(), first.set.begin(), first.set.end());
      } else {
        ranges.emplace_back(first.code_point, first.code_point);
      }
    }
    ranges = normalize(std::move(ranges));
    if (negated) ranges = complement(ranges);
    if (ranges.empty()) refuse(start, "class that matches nothing");
    return set_node(std::move(ranges));
  }

  Atom parse_class_atom() {
    const size_t start = pos_;
    const uint32_t c = next();
    if (c == '\\') return parse_escape(start, /*in_class=*/true);
    return char_atom(c);
  }

  // After a `\` at `start`.
  Atom parse_escape(size_t start, bool in_class) {
    if (at_end()) refuse(start, "'\\' at the end of the pattern");
    const uint32_t c = next();
    switch (c) {
      case 'n':
        return char_atom(0x0A);
      case 'r':
        return char_atom(0x0D);
      case 't':
        return char_atom(0x09);
      case 'f':
        return char_atom(0x0C);
      case 'v':
        return char_atom(0x0B);
      case '0':
        if (is_ascii_digit(peek())) refuse(start, "octal escape");
        return char_atom(0);
      case 'x': {
        if (!is_hex_digit(peek()) || !is_hex_digit(peek(1))) {
          refuse(start, "bad escape \\x (it takes two hex digits)");
        }
        const uint32_t high = hex_value(next());
        return char_atom(high * 16 + hex_value(next()));
      }
      case 'u':
        return char_atom(parse_unicode_escape(start));
      case 'c':
        if (!is_ascii_letter(peek())) refuse(start, "bad escape \\c (it takes a letter)");
        return char_atom(next() % 32);
      case 'd':
        return set_atom(digit_set());
      case 'D':
        return set_atom(complement(digit_set()));
      case 'w':
        return set_atom(word_set());
      case 'W':
        return set_atom(complement(word_set()));
      case 's':
        return set_atom(space_set());
      case 'S':
        return set_atom(complement(space_set()));
      case 'b':
        // Inside a class \b is the backspace character, not a boundary.
        if (in_class) return char_atom(0x08);
        refuse(start, "word boundary \\b");
      case 'B':
        refuse(start, in_class ? "bad escape \\B in a class" : "word boundary \\B");
      case 'k':
        refuse(start, "named backreference \\k");
      case 'p':
      case 'P':
        refuse(start, "Unicode property escape \\p / \\P");
      default:
        break;
    }
    if (c >= '1' && c <= '9') refuse(start, in_class ? "octal escape" : "backreference");
    // Escaped ASCII punctuation stands for itself (Annex B's identity
    // escapes, a superset of the `u` flag's). An escaped letter or digit
    // without a meaning here has one in other dialects (\a, \e, \z, \h), so
    // it is refused rather than read as the letter.
    if (c >= 0x20 && c <= 0x7E && !is_ascii_letter(c) && !is_ascii_digit(c)) return char_atom(c);
    refuse(start, "unknown escape");
  }

  // \uHHHH (a surrogate pair of two such escapes making one code point) or
  // \u{H...}, after the `u`.
  uint32_t parse_unicode_escape(size_t start) {
    if (consume('{')) {
      uint32_t value = 0;
      int digits = 0;
      while (is_hex_digit(peek())) {
        value = std::min<uint32_t>(value * 16 + hex_value(next()), kMaxCodePoint + 1);
        ++digits;
      }
      if (digits == 0 || !consume('}') || value > kMaxCodePoint) refuse(start, "bad escape \\u{...}");
      if (value >= kSurrogateFirst && value <= kSurrogateLast) refuse(start, "lone surrogate escape");
      return value;
    }
    // Four hex digits `ahead` code points from here.
    const auto four_hex = [this](size_t ahead) -> std::optional<uint32_t> {
      uint32_t value = 0;
      for (size_t k = 0; k < 4; ++k) {
        const uint32_t c = peek(ahead + k);
        if (!is_hex_digit(c)) return std::nullopt;
        value = value * 16 + hex_value(c);
      }
      return value;
    };
    const std::optional<uint32_t> unit = four_hex(0);
    if (!unit) refuse(start, "bad escape \\u (it takes four hex digits or {...})");
    pos_ += 4;
    if (*unit < kSurrogateFirst || *unit > kSurrogateLast) return *unit;
    if (*unit <= 0xDBFF && peek() == '\\' && peek(1) == 'u') {
      const std::optional<uint32_t> low = four_hex(2);
      if (low && *low >= 0xDC00 && *low <= kSurrogateLast) {
        pos_ += 6;
        return 0x10000 + ((*unit - kSurrogateFirst) << 10) + (*low - 0xDC00);
      }
    }
    refuse(start, "lone surrogate escape");
  }

  std::vector<uint32_t> code_points_;
  std::vector<size_t> offsets_;  // byte offset of each code point, then the pattern's size
  size_t pos_ = 0;
  int depth_ = 0;
};

// The letter of a two-character JSON escape (\" \\ \b \f \n \r \t), 0 when
// the code point has none.
char json_short_escape(uint32_t c) {
  switch (c) {
    case '"':
      return '"';
    case '\\':
      return '\\';
    case 0x08:
      return 'b';
    case 0x0C:
      return 'f';
    case 0x0A:
      return 'n';
    case 0x0D:
      return 'r';
    case 0x09:
      return 't';
    default:
      return 0;
  }
}

// How nlohmann::json::dump() writes `c` inside a string.
void append_json_escaped(std::string& out, uint32_t c) {
  if (const char letter = json_short_escape(c)) {
    out += '\\';
    out += letter;
  } else if (c < 0x20) {
    out += fmt::format("\\u{:04x}", c);
  } else {
    unicode::append_utf8(static_cast<char32_t>(c), out);
  }
}

// One code point as it stands inside an EBNF class.
void append_class_char(std::string& out, uint32_t c) {
  if (c == ']' || c == '\\' || c == '^' || c == '-' || c == '[') {
    out += '\\';
    out += static_cast<char>(c);
  } else if (c >= 0x20 && c <= 0x7E) {
    out += static_cast<char>(c);
  } else if (c <= 0xFFFF) {
    out += fmt::format("\\u{:04X}", c);
  } else {
    out += fmt::format("\\U{:08X}", c);
  }
}

std::string class_text(const Ranges& ranges, bool negated) {
  std::string out = negated ? "[^" : "[";
  for (const auto& [lo, hi] : ranges) {
    append_class_char(out, lo);
    if (hi == lo) continue;
    out += '-';
    append_class_char(out, hi);
  }
  out += ']';
  return out;
}

// `set` (normalized, not empty) as one EBNF class, negated where that is shorter.
std::string plain_set_text(const Ranges& set) {
  const Ranges outside = complement(set);
  if (outside.empty()) return ".";
  return outside.size() < set.size() ? class_text(outside, /*negated=*/true) : class_text(set, /*negated=*/false);
}

// EBNF text and how tightly it binds, so that the caller knows where it
// needs parentheses.
struct Expr {
  // kQuantified: a primary with a quantifier, which takes no second one.
  enum class Binding : uint8_t { kPrimary, kQuantified, kSequence, kChoice };
  std::string text;
  Binding binding = Binding::kPrimary;
};

std::string parenthesized(const Expr& expr, Expr::Binding loosest_allowed) {
  return expr.binding > loosest_allowed ? "(" + expr.text + ")" : expr.text;
}

class Emitter {
 public:
  Emitter(bool json_escaped, std::string_view prefix) : json_escaped_(json_escaped), prefix_(prefix) {}

  Expr emit(const Node& node) {
    switch (node.kind) {
      case Node::Kind::kEmpty:
        return {ebnf_literal(""), Expr::Binding::kPrimary};
      case Node::Kind::kChar:
        return {ebnf_literal(encode(node.code_point)), Expr::Binding::kPrimary};
      case Node::Kind::kSet:
        return emit_set(node.set);
      case Node::Kind::kSequence:
        return emit_sequence(node.children);
      case Node::Kind::kChoice: {
        std::string text;
        for (const Node& child : node.children) {
          if (!text.empty()) text += " | ";
          text += emit(child).text;
        }
        return {std::move(text), Expr::Binding::kChoice};
      }
      case Node::Kind::kRepeat:
        return {parenthesized(emit(node.children[0]), Expr::Binding::kPrimary) + quantifier(node.min, node.max),
                Expr::Binding::kQuantified};
    }
    BASALT_ASSERT(false);
  }

  // Any one code point, for the unanchored sides of a search.
  Expr emit_any() { return emit_set(any_set()); }

  // The rules this emitter introduced for sets, one line each.
  const std::string& helper_rules() const { return helper_rules_; }

 private:
  std::string encode(uint32_t c) const {
    std::string out;
    if (json_escaped_) {
      append_json_escaped(out, c);
    } else {
      unicode::append_utf8(static_cast<char32_t>(c), out);
    }
    return out;
  }

  // Adjacent characters become one literal.
  Expr emit_sequence(const std::vector<Node>& children) {
    std::vector<Expr> items;
    std::string pending;
    const auto flush = [&]() {
      if (pending.empty()) return;
      items.push_back({ebnf_literal(pending), Expr::Binding::kPrimary});
      pending.clear();
    };
    for (const Node& child : children) {
      if (child.kind == Node::Kind::kChar) {
        pending += encode(child.code_point);
        continue;
      }
      flush();
      items.push_back(emit(child));
    }
    flush();
    if (items.size() == 1) return items[0];
    std::string text;
    for (const Expr& item : items) {
      if (!text.empty()) text += ' ';
      text += parenthesized(item, Expr::Binding::kSequence);
    }
    return {std::move(text), Expr::Binding::kSequence};
  }

  static std::string quantifier(int32_t min, int32_t max) {
    if (max < 0) return min == 0 ? "*" : min == 1 ? "+" : fmt::format("{{{},}}", min);
    if (min == 0 && max == 1) return "?";
    if (min == max) return fmt::format("{{{}}}", min);
    return fmt::format("{{{},{}}}", min, max);
  }

  // Without escaping a set is one class. JSON-escaped, the code points a
  // string cannot carry raw become their escape sequences: \" \\ and the
  // five letter escapes after one backslash, the other controls as
  // \u000X / \u001X with a class of lowercase hex digits.
  Expr emit_set(const Ranges& set) {
    if (!json_escaped_) return {plain_set_text(set), Expr::Binding::kPrimary};
    std::vector<Expr> parts;
    const Ranges raw = intersect(set, complement(json_escaped_set()));
    if (!raw.empty()) parts.push_back({plain_set_text(raw), Expr::Binding::kPrimary});
    Ranges letters;
    Ranges low_digits[2];
    for (const auto& [lo, hi] : intersect(set, json_escaped_set())) {
      for (uint32_t c = lo; c <= hi; ++c) {
        if (const char letter = json_short_escape(c)) {
          letters.emplace_back(letter, letter);
        } else {
          const uint32_t digit = c & 0x0F;
          const uint32_t digit_char = digit < 10 ? '0' + digit : 'a' + digit - 10;
          low_digits[c >> 4].emplace_back(digit_char, digit_char);
        }
      }
    }
    add_escape_part(parts, "\\", normalize(std::move(letters)));
    add_escape_part(parts, "\\u000", normalize(std::move(low_digits[0])));
    add_escape_part(parts, "\\u001", normalize(std::move(low_digits[1])));
    BASALT_ASSERT(!parts.empty());
    if (parts.size() == 1) return parts[0];
    std::string body;
    for (const Expr& part : parts) {
      if (!body.empty()) body += " | ";
      body += part.text;
    }
    return {helper_rule(body), Expr::Binding::kPrimary};
  }

  // `lead` followed by one of the ASCII characters `tails`.
  static void add_escape_part(std::vector<Expr>& parts, std::string_view lead, const Ranges& tails) {
    if (tails.empty()) return;
    if (tails.size() == 1 && tails[0].first == tails[0].second) {
      std::string text(lead);
      text += static_cast<char>(tails[0].first);
      parts.push_back({ebnf_literal(text), Expr::Binding::kPrimary});
      return;
    }
    parts.push_back({ebnf_literal(lead) + " " + class_text(tails, /*negated=*/false), Expr::Binding::kSequence});
  }

  // A rule for a set that takes several alternatives, shared by every use:
  // a repetition bound then repeats one reference rather than the whole
  // choice.
  std::string helper_rule(const std::string& body) {
    auto [it, inserted] = helper_names_.try_emplace(body);
    if (inserted) {
      it->second = fmt::format("{}{}", prefix_, helper_names_.size());
      helper_rules_ += fmt::format("{} ::= {}\n", it->second, body);
    }
    return it->second;
  }

  bool json_escaped_;
  std::string prefix_;
  std::map<std::string, std::string> helper_names_;  // body -> rule name
  std::string helper_rules_;
};

}  // namespace

RegexRules regex_to_ebnf(std::string_view pattern, RegexMode mode, bool json_escaped, std::string_view prefix) {
  for (const char c : prefix) {
    const bool name_char =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    BASALT_CHECK(name_char, "regex: rule prefix \"{}\" has characters outside [A-Za-z0-9_.-]", prefix);
  }
  const std::vector<Alternative> alternatives = Parser(pattern).parse();
  Emitter emitter(json_escaped, prefix);
  // Made only when a side needs it: in JSON it adds a helper rule.
  std::string any_text;
  const auto any_star = [&]() {
    if (any_text.empty()) any_text = parenthesized(emitter.emit_any(), Expr::Binding::kPrimary) + "*";
    return any_text;
  };
  std::string root_body;
  for (const Alternative& alternative : alternatives) {
    const bool pad_start = mode == RegexMode::kSearch && !alternative.anchored_start;
    const bool pad_end = mode == RegexMode::kSearch && !alternative.anchored_end;
    std::string text;
    if (alternative.body.kind == Node::Kind::kEmpty && (pad_start || pad_end)) {
      // One unanchored side already takes any text.
      text = any_star();
    } else {
      if (pad_start) text = any_star() + ' ';
      text += parenthesized(emitter.emit(alternative.body), Expr::Binding::kSequence);
      if (pad_end) {
        text += ' ';
        text += any_star();
      }
    }
    if (!root_body.empty()) root_body += " | ";
    root_body += text;
  }
  RegexRules result;
  result.root = fmt::format("{}root", prefix);
  result.rules = fmt::format("{} ::= {}\n{}", result.root, root_body, emitter.helper_rules());
  return result;
}

}  // namespace basalt

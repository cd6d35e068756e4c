#include "grammar/regex.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <unordered_map>
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
  enum class Kind : uint8_t { kEmpty, kChar, kSet, kSequence, kChoice, kRepeat, kLook };
  Kind kind = Kind::kEmpty;
  uint32_t code_point = 0;     // kChar
  Ranges set;                  // kSet, normalized and never empty
  std::vector<Node> children;  // kSequence, kChoice; kRepeat has one
  int32_t min = 0, max = -1;   // kRepeat; max < 0: unbounded
  int32_t look = -1;           // kLook: its index among the pattern's lookaheads
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

// (?=...) or (?!...): the text from where it stands on must (must not)
// begin with a match of one of its alternatives, or be one where the
// alternative ends with `$`.
struct Lookahead {
  bool negative = false;
  size_t offset = 0;  // bytes into the pattern, for messages
  std::vector<Alternative> alternatives;
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

// The code points of a Unicode General_Category, by the names ECMAScript
// accepts in \p{...} (short or long; the tables' Unicode version); null for
// any other name. Each set is built once, from the tokenizer's tables.
const Ranges* category_set(std::string_view name) {
  using unicode::Category;
  using unicode::category_bit;
  static const std::vector<std::tuple<std::string_view, std::string_view, unicode::CategoryMask>> kNames = {
      {"L", "Letter", unicode::kLetterMask},
      {"LC", "Cased_Letter",
       category_bit(Category::kLu) | category_bit(Category::kLl) | category_bit(Category::kLt)},
      {"Lu", "Uppercase_Letter", category_bit(Category::kLu)},
      {"Ll", "Lowercase_Letter", category_bit(Category::kLl)},
      {"Lt", "Titlecase_Letter", category_bit(Category::kLt)},
      {"Lm", "Modifier_Letter", category_bit(Category::kLm)},
      {"Lo", "Other_Letter", category_bit(Category::kLo)},
      {"M", "Mark", unicode::kMarkMask},
      {"Mn", "Nonspacing_Mark", category_bit(Category::kMn)},
      {"Mc", "Spacing_Mark", category_bit(Category::kMc)},
      {"Me", "Enclosing_Mark", category_bit(Category::kMe)},
      {"N", "Number", unicode::kNumberMask},
      {"Nd", "Decimal_Number", category_bit(Category::kNd)},
      {"Nl", "Letter_Number", category_bit(Category::kNl)},
      {"No", "Other_Number", category_bit(Category::kNo)},
      {"P", "Punctuation", unicode::kPunctuationMask},
      {"Pc", "Connector_Punctuation", category_bit(Category::kPc)},
      {"Pd", "Dash_Punctuation", category_bit(Category::kPd)},
      {"Ps", "Open_Punctuation", category_bit(Category::kPs)},
      {"Pe", "Close_Punctuation", category_bit(Category::kPe)},
      {"Pi", "Initial_Punctuation", category_bit(Category::kPi)},
      {"Pf", "Final_Punctuation", category_bit(Category::kPf)},
      {"Po", "Other_Punctuation", category_bit(Category::kPo)},
      {"S", "Symbol", unicode::kSymbolMask},
      {"Sm", "Math_Symbol", category_bit(Category::kSm)},
      {"Sc", "Currency_Symbol", category_bit(Category::kSc)},
      {"Sk", "Modifier_Symbol", category_bit(Category::kSk)},
      {"So", "Other_Symbol", category_bit(Category::kSo)},
      {"Z", "Separator", unicode::kSeparatorMask},
      {"Zs", "Space_Separator", category_bit(Category::kZs)},
      {"Zl", "Line_Separator", category_bit(Category::kZl)},
      {"Zp", "Paragraph_Separator", category_bit(Category::kZp)},
      {"C", "Other", unicode::kOtherMask},
      {"Cc", "Control", category_bit(Category::kCc)},
      {"Cf", "Format", category_bit(Category::kCf)},
      {"Cs", "Surrogate", category_bit(Category::kCs)},
      {"Co", "Private_Use", category_bit(Category::kCo)},
      {"Cn", "Unassigned", category_bit(Category::kCn)},
  };
  static std::mutex mu;
  static std::map<unicode::CategoryMask, Ranges> built;
  for (const auto& [short_name, long_name, mask] : kNames) {
    if (name != short_name && name != long_name) continue;
    const std::lock_guard<std::mutex> lock(mu);
    auto [it, inserted] = built.try_emplace(mask);
    if (inserted) {
      Ranges ranges;
      for (uint32_t c = 0; c <= kMaxCodePoint; ++c) {
        if (!unicode::in_categories(static_cast<char32_t>(c), mask)) continue;
        if (!ranges.empty() && ranges.back().second + 1 == c) {
          ranges.back().second = c;
        } else {
          ranges.emplace_back(c, c);
        }
      }
      it->second = normalize(std::move(ranges));
    }
    return &it->second;
  }
  return nullptr;
}

// Recursive descent over the pattern's code points (ECMAScript's Pattern
// grammar with the `u` flag's meaning; see regex.h for what is accepted).
class Parser {
 public:
  explicit Parser(std::string_view pattern) {
    decode(pattern);
    end_ = code_points_.size();
  }

  std::vector<Alternative> parse() {
    std::vector<Alternative> alternatives;
    do {
      if (parse_group_alternatives(alternatives)) continue;
      Alternative alternative;
      alternative.anchored_start = consume('^');
      alternative.body = parse_sequence(&alternative.anchored_end);
      alternatives.push_back(std::move(alternative));
    } while (consume('|'));
    // parse_sequence stops only at the end, `|` or `)`.
    if (!at_end()) refuse(pos_, "unbalanced ')'");
    return alternatives;
  }
  // The lookaheads kLook nodes index, after parse().
  const std::vector<Lookahead>& lookaheads() const { return lookaheads_; }

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

  // A top-level alternative that is one group and nothing else, "(^a|b$)",
  // stands for the group's alternatives, so that the anchors at their
  // edges are at the pattern's edges (the same language). Parsed with the
  // end moved to the group's `)`.
  bool parse_group_alternatives(std::vector<Alternative>& out) {
    if (peek() != '(') return false;
    const size_t start = pos_;
    const auto at = [&](size_t i) { return i < end_ ? code_points_[i] : kEndOfPattern; };
    size_t body = pos_ + 1;
    if (at(body) == '?') {
      if (at(body + 1) != ':') return false;  // named groups and lookarounds parse as ever
      body += 2;
    }
    size_t depth = 1, close = body;
    bool in_class = false;
    for (; close < end_; ++close) {
      const uint32_t c = code_points_[close];
      if (c == '\\') {
        ++close;
      } else if (in_class) {
        in_class = c != ']';
      } else if (c == '[') {
        in_class = true;
      } else if (c == '(') {
        ++depth;
      } else if (c == ')' && --depth == 0) {
        break;
      }
    }
    if (close >= end_ || (close + 1 < end_ && code_points_[close + 1] != '|')) return false;
    if (++depth_ > kMaxGroupNesting) refuse(start, fmt::format("groups nested deeper than {}", kMaxGroupNesting));
    const size_t outer_end = end_;
    end_ = close;
    pos_ = body;
    std::vector<Alternative> inner = parse();
    end_ = outer_end;
    pos_ = close + 1;
    --depth_;
    for (Alternative& alternative : inner) out.push_back(std::move(alternative));
    return true;
  }

  bool at_end() const { return pos_ >= end_; }
  // The code point `ahead` places on, or kEndOfPattern.
  uint32_t peek(size_t ahead = 0) const {
    return pos_ + ahead < end_ ? code_points_[pos_ + ahead] : kEndOfPattern;
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
        const bool ends_alternative = pos_ + 1 == end_ || code_points_[pos_ + 1] == '|' ||
                                      (in_lookahead_ && code_points_[pos_ + 1] == ')');
        if (anchored_end == nullptr || !ends_alternative) {
          refuse(start, "anchor '$' not at the end of a top-level alternative");
        }
        ++pos_;
        *anchored_end = true;
        break;
      }
      Node atom = parse_atom();
      if (atom.kind == Node::Kind::kLook && is_quantifier_start()) refuse(pos_, "quantifier on a lookahead");
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
        ++pos_;
        return parse_lookahead(start, kind == '!');
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

  // The body of (?=...) or (?!...) after its `?=` / `?!`: alternatives that
  // may end with `$`. A lookahead inside one is refused.
  Node parse_lookahead(size_t start, bool negative) {
    if (in_lookahead_) refuse(start, "lookahead inside a lookahead");
    if (++depth_ > kMaxGroupNesting) refuse(start, fmt::format("groups nested deeper than {}", kMaxGroupNesting));
    in_lookahead_ = true;
    Lookahead look;
    look.negative = negative;
    look.offset = offsets_[start];
    do {
      Alternative alternative;
      alternative.body = parse_sequence(&alternative.anchored_end);
      look.alternatives.push_back(std::move(alternative));
    } while (consume('|'));
    if (!consume(')')) refuse(start, "unbalanced '('");
    in_lookahead_ = false;
    --depth_;
    Node node;
    node.kind = Node::Kind::kLook;
    node.look = static_cast<int32_t>(lookaheads_.size());
    lookaheads_.push_back(std::move(look));
    return node;
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
      case 'P': {
        const Ranges& set = parse_property(start);
        Ranges chosen = c == 'p' ? set : complement(set);
        if (chosen.empty()) refuse(start, "property escape that matches no code point");
        return set_atom(std::move(chosen));
      }
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

  // \p{Name} after the `p`: a General_Category by its short or long name
  // (L, Letter, Nd, Decimal_Number, ...), optionally as gc=Name or
  // General_Category=Name. Scripts and binary properties are refused.
  const Ranges& parse_property(size_t start) {
    if (!consume('{')) refuse(start, "bad escape \\p (it takes {name})");
    std::string name;
    while (!at_end() && peek() != '}' && name.size() < 64) name.push_back(static_cast<char>(next() & 0x7F));
    if (!consume('}')) refuse(start, "unterminated \\p{...}");
    for (const char* prefix : {"gc=", "General_Category="}) {
      if (name.starts_with(prefix)) name.erase(0, std::string_view(prefix).size());
    }
    const Ranges* set = category_set(name);
    if (set == nullptr) refuse(start, "Unicode property other than a general category");
    return *set;
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
  size_t end_ = 0;  // where parsing stops: the pattern's end, or a group's ')' (parse_group_alternatives)
  std::vector<size_t> offsets_;  // byte offset of each code point, then the pattern's size
  size_t pos_ = 0;
  int depth_ = 0;
  bool in_lookahead_ = false;
  std::vector<Lookahead> lookaheads_;
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
      case Node::Kind::kLook:
        break;  // patterns with lookaheads go through RegexLanguage
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

 public:
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

 private:
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

// Rule names are made of EBNF name characters.
void check_rule_prefix(std::string_view prefix) {
  for (const char c : prefix) {
    const bool name_char =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    BASALT_CHECK(name_char, "regex: rule prefix \"{}\" has characters outside [A-Za-z0-9_.-]", prefix);
  }
}

}  // namespace

RegexRules regex_to_ebnf(std::string_view pattern, RegexMode mode, bool json_escaped, std::string_view prefix) {
  check_rule_prefix(prefix);
  Parser parser(pattern);
  const std::vector<Alternative> alternatives = parser.parse();
  // A lookahead constrains all the text after it: the pattern is written
  // from its automaton, where that is a product.
  if (!parser.lookaheads().empty()) return RegexLanguage::of_pattern(pattern, mode).to_ebnf(json_escaped, prefix);
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

// --- RegexLanguage -----------------------------------------------------------

namespace basalt {

namespace {

// A Thompson automaton whose moves read one code point of a set: the way
// from a pattern's tree (or a list of strings) to a RegexLanguage.
class CodePointNfa {
 public:
  // Bounded repetition copies its operand, so a pattern such as
  // (a{100}){100} is refused here rather than by the subset construction.
  static constexpr size_t kMaxStates = size_t{1} << 16;

  struct Move {
    Ranges set;
    uint32_t target;
  };
  struct State {
    std::vector<uint32_t> epsilon;
    std::vector<Move> moves;
    // Empty moves that pass a lookahead: (target, its index).
    std::vector<std::pair<uint32_t, uint32_t>> looks;
  };

  uint32_t add() {
    BASALT_CHECK(states_.size() < kMaxStates,
                 "regex: the pattern is too large to combine with other patterns (more than {} automaton states)",
                 kMaxStates);
    states_.emplace_back();
    return static_cast<uint32_t>(states_.size() - 1);
  }
  void epsilon(uint32_t from, uint32_t to) { states_[from].epsilon.push_back(to); }
  void move(uint32_t from, Ranges set, uint32_t to) { states_[from].moves.push_back({std::move(set), to}); }

  // Adds the text `node` matches, read from `from`; returns the state where
  // it ends. Nothing is added that leads into `from`, so alternatives may
  // share it.
  uint32_t build(const Node& node, uint32_t from) {
    switch (node.kind) {
      case Node::Kind::kEmpty:
        return from;
      case Node::Kind::kChar:
      case Node::Kind::kSet: {
        const uint32_t to = add();
        move(from, node.kind == Node::Kind::kChar ? Ranges{{node.code_point, node.code_point}} : node.set, to);
        return to;
      }
      case Node::Kind::kSequence:
        for (const Node& child : node.children) from = build(child, from);
        return from;
      case Node::Kind::kChoice: {
        const uint32_t end = add();
        for (const Node& child : node.children) epsilon(build(child, from), end);
        return end;
      }
      case Node::Kind::kLook: {
        const uint32_t to = add();
        states_[from].looks.emplace_back(to, static_cast<uint32_t>(node.look));
        has_looks_ = true;
        return to;
      }
      case Node::Kind::kRepeat: {
        const Node& body = node.children[0];
        for (int32_t i = 0; i < node.min; ++i) from = build(body, from);
        if (node.max < 0) {
          const uint32_t loop = add();
          epsilon(from, loop);
          epsilon(build(body, loop), loop);
          return loop;
        }
        const uint32_t end = add();
        for (int32_t i = node.min; i < node.max; ++i) {
          epsilon(from, end);
          from = build(body, from);
        }
        epsilon(from, end);
        return end;
      }
    }
    BASALT_ASSERT(false);
  }

  // Any code points, read from `from` (the unanchored side of a search).
  uint32_t any_text(uint32_t from) {
    const uint32_t loop = add();
    epsilon(from, loop);
    move(loop, any_set(), loop);
    return loop;
  }

  // `set` and every state its epsilon moves reach, sorted, each once.
  void close(std::vector<uint32_t>& set) const {
    // Marks by pass number: a subset construction closes thousands of sets
    // of an automaton of thousands of states.
    if (seen_.size() < states_.size()) seen_.resize(states_.size(), 0);
    if (++pass_ == 0) {
      std::fill(seen_.begin(), seen_.end(), 0);
      pass_ = 1;
    }
    size_t kept = 0;
    for (const uint32_t s : set) {
      if (seen_[s] == pass_) continue;
      seen_[s] = pass_;
      set[kept++] = s;
    }
    set.resize(kept);
    work_.assign(set.begin(), set.end());
    while (!work_.empty()) {
      const uint32_t s = work_.back();
      work_.pop_back();
      for (const uint32_t t : states_[s].epsilon) {
        if (seen_[t] == pass_) continue;
        seen_[t] = pass_;
        set.push_back(t);
        work_.push_back(t);
      }
    }
    std::sort(set.begin(), set.end());
  }

  const State& operator[](uint32_t s) const { return states_[s]; }
  size_t size() const { return states_.size(); }
  bool has_looks() const { return has_looks_; }

 private:
  std::vector<State> states_;
  bool has_looks_ = false;
  mutable std::vector<uint32_t> seen_, work_;  // close()'s scratch
  mutable uint32_t pass_ = 0;
};

bool ranges_contain(const Ranges& set, uint32_t c) {
  const auto it = std::upper_bound(set.begin(), set.end(), std::make_pair(c, kMaxCodePoint + 1));
  return it != set.begin() && std::prev(it)->second >= c;
}

// The sets a subset construction meets, numbered in the order met; one past
// `max_states` throws.
// Hashes a set of NFA states (sorted, so equal sets hash alike).
struct StateSetHash {
  size_t operator()(const std::vector<uint32_t>& set) const {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const uint32_t s : set) h = (h ^ s) * 0x100000001b3ull;
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

template <typename Set, typename Index = std::map<Set, uint32_t>>
class SetNumbering {
 public:
  explicit SetNumbering(size_t max_states) : max_states_(max_states) {}
  // Copies `set` only when it is new.
  uint32_t id_of(const Set& set) {
    if (const auto it = ids_.find(set); it != ids_.end()) return it->second;
    return id_of(Set(set));
  }
  uint32_t id_of(Set&& set) {
    const auto [it, inserted] = ids_.try_emplace(set, static_cast<uint32_t>(sets_.size()));
    if (inserted) {
      BASALT_CHECK(sets_.size() < max_states_,
                   "regex: the patterns combine into more than {} automaton states; use simpler patterns",
                   max_states_);
      sets_.push_back(std::move(set));
    }
    return it->second;
  }
  size_t size() const { return sets_.size(); }
  const Set& operator[](size_t i) const { return sets_[i]; }

 private:
  size_t max_states_;
  Index ids_;
  std::vector<Set> sets_;
};

using EdgeList = std::vector<std::tuple<uint32_t, uint32_t, uint32_t>>;  // (lo, hi, target)

// Appends code points [lo, hi] -> target, extending the last edge where it
// has the same target.
void extend_edges(EdgeList& edges, uint32_t lo, uint32_t hi, uint32_t target) {
  if (!edges.empty() && std::get<2>(edges.back()) == target) {
    std::get<1>(edges.back()) = hi;
  } else {
    edges.emplace_back(lo, hi, target);
  }
}

// Counts `cuts * per_cut` against the work bound of one subset
// construction.
void charge_cuts(size_t cuts, size_t per_cut, size_t& work) {
  // Each state checks every move of its set at every cut of the code
  // points; classes of hundreds of ranges (\p{L}) under a bounded
  // repetition make that the cost, which patterns from requests must not
  // make unbounded.
  constexpr size_t kMaxWork = size_t{1} << 22;
  work += cuts * per_cut;
  BASALT_CHECK(work <= kMaxWork,
               "regex: the patterns are too large to combine (building their automaton takes more than {} steps)",
               kMaxWork);
}

// Sorted, distinct cut points, charged as above.
void finish_cuts(std::vector<uint32_t>& cuts, size_t per_cut, size_t& work) {
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  charge_cuts(cuts.size(), per_cut, work);
}

// Edges cover U+0000..U+10FFFF. Surrogates are never read, so the edge
// before them extends over them and absorbs the next edge when that one has
// the same target: equal behaviour on scalar values gives equal edge lists,
// which minimization compares.
void canonicalize(EdgeList& edges) {
  thread_local EdgeList out;  // kept between calls: a subset construction makes one per state
  out.clear();
  for (auto [lo, hi, target] : edges) {
    if (lo >= kSurrogateFirst && hi <= kSurrogateLast) continue;
    if (lo >= kSurrogateFirst && lo <= kSurrogateLast) lo = kSurrogateLast + 1;
    if (!out.empty() && std::get<2>(out.back()) == target) {
      std::get<1>(out.back()) = hi;
      continue;
    }
    if (!out.empty()) std::get<1>(out.back()) = lo - 1;
    out.emplace_back(out.empty() ? 0 : lo, hi, target);
  }
  edges.swap(out);
}

// Subset construction over an automaton whose only accepting state is
// `accept`. Each set's moves are swept in code point order: a move's range
// adds its target where it begins and takes it away past its end, so each
// interval between cuts knows its targets without testing every move.
template <typename State, typename Edge>
std::vector<State> determinize(const CodePointNfa& nfa, uint32_t start, uint32_t accept, size_t max_states) {
  SetNumbering<std::vector<uint32_t>, std::unordered_map<std::vector<uint32_t>, uint32_t, StateSetHash>> sets(
      max_states);
  std::vector<uint32_t> closed;  // id_of's scratch
  const auto id_of = [&](const std::vector<uint32_t>& set) {
    closed.assign(set.begin(), set.end());
    nfa.close(closed);
    return sets.id_of(closed);
  };
  id_of({start});
  std::vector<State> out;
  size_t work = 0;
  std::vector<std::pair<uint32_t, int64_t>> events;  // (code point, target + 1 entering / -(target + 1) leaving)
  std::vector<uint32_t> count(nfa.size(), 0);        // per target: the ranges covering the sweep's point
  std::vector<uint32_t> targets;                     // those with a count, sorted
  // The target sets met in this state and their ids (seen_count of them;
  // the vectors keep their capacity from state to state).
  std::vector<std::pair<std::vector<uint32_t>, uint32_t>> seen;
  size_t seen_count = 0;
  std::vector<uint32_t> set;
  EdgeList edges;
  for (size_t i = 0; i < sets.size(); ++i) {
    set.assign(sets[i].begin(), sets[i].end());  // sets grows below
    events.clear();
    size_t moves = 0;
    for (const uint32_t s : set) {
      moves += nfa[s].moves.size();
      for (const auto& m : nfa[s].moves) {
        for (const auto& [lo, hi] : m.set) {
          events.emplace_back(lo, int64_t{m.target} + 1);
          events.emplace_back(hi + 1, -(int64_t{m.target} + 1));
        }
      }
    }
    std::sort(events.begin(), events.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    size_t cuts = 2;  // 0 and past the last code point, with every other cut
    for (size_t e = 0; e < events.size(); ++e)
      if ((e == 0 || events[e].first != events[e - 1].first) && events[e].first != 0 &&
          events[e].first != kMaxCodePoint + 1)
        ++cuts;
    charge_cuts(cuts, moves + set.size(), work);
    edges.clear();
    // The intervals of a large class alternate between few target sets:
    // each is closed and looked up once per state.
    seen_count = 0;
    targets.clear();
    size_t e = 0;
    for (uint32_t at = 0; at <= kMaxCodePoint;) {
      for (; e < events.size() && events[e].first == at; ++e) {
        const auto t = static_cast<uint32_t>((events[e].second > 0 ? events[e].second : -events[e].second) - 1);
        if (events[e].second > 0) {
          if (count[t]++ == 0) targets.insert(std::lower_bound(targets.begin(), targets.end(), t), t);
        } else if (--count[t] == 0) {
          targets.erase(std::lower_bound(targets.begin(), targets.end(), t));
        }
      }
      const uint32_t until = e < events.size() ? events[e].first : kMaxCodePoint + 1;
      uint32_t target = 0;
      size_t k = 0;
      while (k < seen_count && seen[k].first != targets) ++k;
      if (k < seen_count) {
        target = seen[k].second;
      } else {
        target = id_of(targets);
        if (seen_count == seen.size()) seen.emplace_back();
        seen[seen_count].first.assign(targets.begin(), targets.end());
        seen[seen_count++].second = target;
      }
      extend_edges(edges, at, until - 1, target);
      at = until;
    }
    for (; e < events.size(); ++e) {  // the ends at the last code point
      const auto t = static_cast<uint32_t>(-events[e].second - 1);
      if (--count[t] == 0) targets.erase(std::lower_bound(targets.begin(), targets.end(), t));
    }
    canonicalize(edges);
    State state;
    state.accepting = std::binary_search(set.begin(), set.end(), accept);
    for (const auto& [lo, hi, target] : edges) state.edges.push_back(Edge{lo, hi, target});
    out.push_back(std::move(state));
  }
  return out;
}

// A lookahead's language, for the subset construction below: the texts
// that satisfy (?=...) from where it stands (its alternatives' matches,
// followed by anything unless the alternative ends with `$`), and for each
// state whether every text on from it is in the language (kAll), none is
// (kNone), or that is still open.
struct LookLanguage {
  enum Fate : uint8_t { kOpen, kAll, kNone };
  bool negative = false;
  RegexLanguage language = RegexLanguage::all();
  std::vector<Fate> fate;
};

// Subset construction for a pattern with lookaheads. A state of the
// automaton is a set of (NFA state, obligations): the lookaheads a path
// passed and has yet to settle, each with where its language stands. An
// obligation whose language has reached kAll (a lookahead's text has
// matched) is met for (?=) and broken for (?!); kNone the other way round;
// at the end of the text an open one is met when its state accepts (for
// (?=)) or does not (for (?!)). Paths with a broken obligation die.
template <typename State, typename Edge>
std::vector<State> determinize_looking(const CodePointNfa& nfa, uint32_t start, uint32_t accept,
                                       const std::vector<LookLanguage>& looks, size_t max_states) {
  using Obligations = std::vector<std::pair<uint32_t, uint32_t>>;  // (lookahead, its state), sorted
  using Element = std::pair<uint32_t, uint32_t>;                  // (NFA state, obligations id)
  std::map<Obligations, uint32_t> obligation_ids;
  std::vector<Obligations> obligations;
  const auto settle = [&](Obligations o) -> std::optional<uint32_t> {
    Obligations open;
    for (const auto& [i, st] : o) {
      const LookLanguage::Fate fate = looks[i].fate[st];
      if (fate == LookLanguage::kOpen) {
        open.emplace_back(i, st);
      } else if ((fate == LookLanguage::kAll) == looks[i].negative) {
        return std::nullopt;  // broken
      }
    }
    std::sort(open.begin(), open.end());
    open.erase(std::unique(open.begin(), open.end()), open.end());
    const auto [it, inserted] = obligation_ids.try_emplace(open, static_cast<uint32_t>(obligations.size()));
    if (inserted) obligations.push_back(open);
    return it->second;
  };
  const auto close = [&](std::vector<Element>& set) {
    std::set<Element> seen(set.begin(), set.end());
    std::vector<Element> work = set;
    while (!work.empty()) {
      const auto [q, o] = work.back();
      work.pop_back();
      const auto add = [&](Element e) {
        if (seen.insert(e).second) work.push_back(e);
      };
      for (const uint32_t t : nfa[q].epsilon) add({t, o});
      for (const auto& [t, i] : nfa[q].looks) {
        Obligations more = obligations[o];
        more.emplace_back(i, 0);
        if (const std::optional<uint32_t> id = settle(std::move(more))) add({t, *id});
      }
    }
    set.assign(seen.begin(), seen.end());
  };
  SetNumbering<std::vector<Element>> sets(max_states);
  const auto id_of = [&](std::vector<Element> set) {
    close(set);
    return sets.id_of(std::move(set));
  };
  id_of({{start, *settle({})}});
  std::vector<State> out;
  size_t work = 0;
  for (size_t n = 0; n < sets.size(); ++n) {
    const std::vector<Element> set = sets[n];  // sets grows below
    std::vector<uint32_t> cuts{0, kMaxCodePoint + 1};
    for (const auto& [q, o] : set) {
      for (const auto& m : nfa[q].moves) {
        for (const auto& [lo, hi] : m.set) {
          cuts.push_back(lo);
          cuts.push_back(hi + 1);
        }
      }
      for (const auto& [i, st] : obligations[o])
        for (const RegexLanguage::Edge& e : looks[i].language.edges(st)) cuts.push_back(e.lo);
    }
    finish_cuts(cuts, set.size(), work);
    EdgeList edges;
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const uint32_t c = cuts[k];
      std::vector<Element> targets;
      for (const auto& [q, o] : set) {
        for (const auto& m : nfa[q].moves) {
          if (!ranges_contain(m.set, c)) continue;
          Obligations moved = obligations[o];
          for (auto& [i, st] : moved) st = looks[i].language.next(st, c);
          if (const std::optional<uint32_t> id = settle(std::move(moved))) targets.emplace_back(m.target, *id);
        }
      }
      std::sort(targets.begin(), targets.end());
      targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
      extend_edges(edges, cuts[k], cuts[k + 1] - 1, id_of(std::move(targets)));
    }
    canonicalize(edges);
    State state;
    for (const auto& [q, o] : set) {
      if (q != accept) continue;
      state.accepting = std::all_of(obligations[o].begin(), obligations[o].end(), [&](const auto& ob) {
        return looks[ob.first].language.accepting(ob.second) != looks[ob.first].negative;
      });
      if (state.accepting) break;
    }
    for (const auto& [lo, hi, target] : edges) state.edges.push_back(Edge{lo, hi, target});
    out.push_back(std::move(state));
  }
  return out;
}

// A rule of a Grammar as code point moves (RegexLanguage::of_rule). A rule
// is built once per place it ends in: references in tail position pass their
// own end on, so a right-linear chain of rules shares one copy of each and
// loops where it refers back; every other reference ends in a state made
// for it, which builds the rule afresh. A rule met again while one of its
// fresh builds is under way refers to itself with text after the reference:
// the language is not regular (or not as written), and that is refused.
class RuleNfaBuilder {
 public:
  RuleNfaBuilder(const Grammar& grammar, CodePointNfa& nfa)
      : grammar_(grammar), nfa_(nfa), expanding_(grammar.rules.size(), false) {}

  // The state rule `rule`'s text starts from, ending in `end`.
  uint32_t start_of(int32_t rule, uint32_t end) {
    BASALT_CHECK(rule >= 0 && static_cast<size_t>(rule) < grammar_.rules.size(), "regex: rule {} out of range", rule);
    const auto [it, inserted] = starts_.try_emplace({rule, end}, 0);
    if (!inserted) return it->second;
    const uint32_t start = nfa_.add();
    it->second = start;
    const uint32_t at = build(grammar_.rules[static_cast<size_t>(rule)].body, start, end);
    if (at != end) nfa_.epsilon(at, end);
    return start;
  }

 private:
  // Adds `e`'s text read from `from`; returns where it ends. `tail_end`:
  // the end of the rule `e` closes (its text is the last of that rule), or
  // none.
  uint32_t build(const GrammarExpr& e, uint32_t from, std::optional<uint32_t> tail_end) {
    using K = GrammarExpr::Kind;
    switch (e.kind) {
      case K::kBytes: {
        BASALT_CHECK(unicode::find_invalid_utf8(e.bytes) == std::string::npos,
                     "regex: a rule's literal is not UTF-8 text");
        size_t pos = 0;
        char32_t c = 0;
        while (unicode::decode_utf8(e.bytes, pos, c)) {
          const uint32_t next = nfa_.add();
          nfa_.move(from, {{static_cast<uint32_t>(c), static_cast<uint32_t>(c)}}, next);
          from = next;
        }
        return from;
      }
      case K::kClass: {
        Ranges set = normalize(Ranges(e.ranges.begin(), e.ranges.end()));
        if (e.negated) set = complement(set);
        const uint32_t next = nfa_.add();
        if (!set.empty()) nfa_.move(from, std::move(set), next);
        return next;
      }
      case K::kRuleRef: {
        if (tail_end) return enter(e.rule, from, *tail_end);
        BASALT_CHECK(!expanding_[static_cast<size_t>(e.rule)],
                     "regex: rule \"{}\" refers to itself with text after the reference (not a regular language)",
                     grammar_.rules[static_cast<size_t>(e.rule)].name);
        expanding_[static_cast<size_t>(e.rule)] = true;
        const uint32_t after = nfa_.add();
        enter(e.rule, from, after);
        expanding_[static_cast<size_t>(e.rule)] = false;
        return after;
      }
      case K::kSequence:
        for (size_t i = 0; i < e.children.size(); ++i)
          from = build(e.children[i], from, i + 1 == e.children.size() ? tail_end : std::nullopt);
        return from;
      case K::kChoice: {
        const uint32_t end = nfa_.add();
        for (const GrammarExpr& child : e.children) {
          const uint32_t at = build(child, from, tail_end);
          if (!(tail_end && at == *tail_end)) nfa_.epsilon(at, end);  // a tail reference went on there
        }
        return end;
      }
      case K::kRepeat: {
        const GrammarExpr& body = e.children[0];
        for (int32_t i = 0; i < e.min; ++i) from = build(body, from, std::nullopt);
        if (e.max < 0) {
          const uint32_t loop = nfa_.add();
          nfa_.epsilon(from, loop);
          nfa_.epsilon(build(body, loop, std::nullopt), loop);
          return loop;
        }
        const uint32_t end = nfa_.add();
        for (int32_t i = e.min; i < e.max; ++i) {
          nfa_.epsilon(from, end);
          from = build(body, from, std::nullopt);
        }
        nfa_.epsilon(from, end);
        return end;
      }
    }
    BASALT_ASSERT(false);
  }

  // Enters rule `rule` from `from`, ending in `end`: the end state is where
  // the text goes on.
  uint32_t enter(int32_t rule, uint32_t from, uint32_t end) {
    nfa_.epsilon(from, start_of(rule, end));
    return end;
  }

  const Grammar& grammar_;
  CodePointNfa& nfa_;
  std::map<std::pair<int32_t, uint32_t>, uint32_t> starts_;
  std::vector<bool> expanding_;
};

}  // namespace

RegexLanguage RegexLanguage::of_pattern(std::string_view pattern, RegexMode mode) {
  Parser parser(pattern);
  const std::vector<Alternative> alternatives = parser.parse();
  CodePointNfa nfa;
  const uint32_t start = nfa.add(), accept = nfa.add();
  for (const Alternative& alternative : alternatives) {
    uint32_t at = start;
    if (mode == RegexMode::kSearch && !alternative.anchored_start) at = nfa.any_text(at);
    at = nfa.build(alternative.body, at);
    if (mode == RegexMode::kSearch && !alternative.anchored_end) at = nfa.any_text(at);
    nfa.epsilon(at, accept);
  }
  if (!nfa.has_looks()) return minimized(determinize<State, Edge>(nfa, start, accept, kMaxStates));
  std::vector<LookLanguage> looks;
  for (const Lookahead& lookahead : parser.lookaheads()) {
    CodePointNfa body;
    const uint32_t from = body.add(), to = body.add();
    for (const Alternative& alternative : lookahead.alternatives) {
      uint32_t at = body.build(alternative.body, from);
      if (!alternative.anchored_end) at = body.any_text(at);
      body.epsilon(at, to);
    }
    LookLanguage look;
    look.negative = lookahead.negative;
    look.language = minimized(determinize<State, Edge>(body, from, to, kMaxStates));
    // kAll: no rejecting state is reachable; kNone: no accepting one.
    const std::vector<State>& states = look.language.states_;
    const std::vector<bool> live = live_states(states);
    std::vector<State> flipped = states;
    for (State& st : flipped) st.accepting = !st.accepting;
    const std::vector<bool> can_reject = live_states(flipped);
    for (size_t st = 0; st < states.size(); ++st)
      look.fate.push_back(!can_reject[st] ? LookLanguage::kAll : !live[st] ? LookLanguage::kNone : LookLanguage::kOpen);
    looks.push_back(std::move(look));
  }
  return minimized(determinize_looking<State, Edge>(nfa, start, accept, looks, kMaxStates));
}

RegexLanguage RegexLanguage::of_strings(const std::vector<std::string>& texts) {
  CodePointNfa nfa;
  const uint32_t start = nfa.add(), accept = nfa.add();
  for (const std::string& text : texts) {
    if (unicode::find_invalid_utf8(text) != std::string::npos) continue;
    uint32_t at = start;
    size_t pos = 0;
    char32_t c = 0;
    while (unicode::decode_utf8(text, pos, c)) {
      const uint32_t next = nfa.add();
      nfa.move(at, {{static_cast<uint32_t>(c), static_cast<uint32_t>(c)}}, next);
      at = next;
    }
    nfa.epsilon(at, accept);
  }
  return minimized(determinize<State, Edge>(nfa, start, accept, kMaxStates));
}

RegexLanguage RegexLanguage::of_rule(const Grammar& grammar, int32_t rule) {
  CodePointNfa nfa;
  const uint32_t accept = nfa.add();
  RuleNfaBuilder builder(grammar, nfa);
  const uint32_t start = builder.start_of(rule, accept);
  return minimized(determinize<State, Edge>(nfa, start, accept, kMaxStates));
}

RegexLanguage RegexLanguage::all() {
  State state;
  state.accepting = true;
  state.edges.push_back({0, kMaxCodePoint, 0});
  return RegexLanguage({state});
}

RegexLanguage RegexLanguage::of_length(int64_t min, int64_t max) {
  BASALT_CHECK(min >= 0 && (max < 0 || min <= max), "regex: length bounds {} to {} are out of order", min, max);
  // State i: i code points read; the last counting state loops when
  // unbounded, or leads to a rejecting sink.
  const int64_t counting = (max < 0 ? min : max) + 1;
  BASALT_CHECK(counting + 1 <= static_cast<int64_t>(kMaxStates),
               "regex: length bound {} needs more than {} automaton states", counting - 1, kMaxStates);
  const auto n = static_cast<uint32_t>(counting);
  std::vector<State> states(max < 0 ? n : n + 1);
  for (uint32_t i = 0; i < states.size(); ++i) {
    states[i].accepting = i < n && i >= min;
    const uint32_t next = i + 1 < n ? i + 1 : max < 0 ? n - 1 : n;
    states[i].edges.push_back({0, kMaxCodePoint, next});
  }
  return minimized(std::move(states));
}

RegexLanguage RegexLanguage::intersect(const RegexLanguage& other) const {
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> ids;
  std::vector<std::pair<uint32_t, uint32_t>> pairs;
  const auto id_of = [&](uint32_t a, uint32_t b) {
    const auto [it, inserted] = ids.try_emplace({a, b}, static_cast<uint32_t>(pairs.size()));
    if (inserted) {
      BASALT_CHECK(pairs.size() < kMaxStates,
                   "regex: the patterns combine into more than {} automaton states; use simpler patterns",
                   kMaxStates);
      pairs.emplace_back(a, b);
    }
    return it->second;
  };
  id_of(0, 0);
  std::vector<State> out;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const State& a = states_[pairs[i].first];
    const State& b = other.states_[pairs[i].second];
    State state;
    state.accepting = a.accepting && b.accepting;
    size_t ia = 0, ib = 0;
    for (uint32_t lo = 0; lo <= kMaxCodePoint;) {
      const Edge& ea = a.edges[ia];
      const Edge& eb = b.edges[ib];
      const uint32_t hi = std::min(ea.hi, eb.hi);
      const uint32_t target = id_of(ea.target, eb.target);
      if (!state.edges.empty() && state.edges.back().target == target) {
        state.edges.back().hi = hi;
      } else {
        state.edges.push_back({lo, hi, target});
      }
      if (ea.hi == hi) ++ia;
      if (eb.hi == hi) ++ib;
      lo = hi + 1;
    }
    out.push_back(std::move(state));
  }
  return minimized(std::move(out));
}

RegexLanguage RegexLanguage::complement() const {
  std::vector<State> flipped = states_;
  for (State& s : flipped) s.accepting = !s.accepting;
  return RegexLanguage(std::move(flipped));  // flipping keeps a minimal automaton minimal
}

// The states from which an accepting one can be reached.
std::vector<bool> RegexLanguage::live_states(const std::vector<State>& states) {
  std::vector<std::vector<uint32_t>> sources(states.size());
  std::vector<uint32_t> work;
  std::vector<bool> live(states.size(), false);
  for (uint32_t s = 0; s < states.size(); ++s) {
    for (const Edge& e : states[s].edges) sources[e.target].push_back(s);
    if (states[s].accepting) {
      live[s] = true;
      work.push_back(s);
    }
  }
  while (!work.empty()) {
    const uint32_t s = work.back();
    work.pop_back();
    for (const uint32_t from : sources[s]) {
      if (live[from]) continue;
      live[from] = true;
      work.push_back(from);
    }
  }
  return live;
}

// Minimization: states start split into those that can no longer accept
// (one sink), accepting and rejecting ones, and classes split while their
// members' edges lead into different classes (refine_classes). Past
// kMinimizeLimit states, or kMinimizeCells states times letters, only the
// sink is merged: the automaton stays correct and reachable-only, if not
// minimal. Minimal automata matter downstream: a bounded string's text
// rebuilt from the grammar (BoundedText) is thousands of states unminimized
// for a uri and under two hundred minimized.
namespace {

// Hopcroft's partition refinement: splits the classes `cls` (numbered 0 to
// count - 1) until states of one class move alike, class for class, on
// every code point; returns the classes' count, `cls` renumbered. The
// alphabet is the intervals of code points no state's edge boundary splits.
// Each split puts the smaller half to work, so an automaton that counts
// (at most 50 words: a chain of a hundred states) takes one pass per split
// rather than a round per state of the chain.
template <typename State>
std::vector<uint32_t> letter_cuts(const std::vector<State>& states) {
  std::vector<uint32_t> cuts;
  for (const State& s : states)
    for (const auto& e : s.edges) cuts.push_back(e.lo);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  return cuts;
}

// `cuts`: letter_cuts(states), where each letter begins.
template <typename State>
size_t refine_classes(const std::vector<State>& states, const std::vector<uint32_t>& cuts, std::vector<uint32_t>& cls,
                      size_t count) {
  const size_t n = states.size();
  const size_t letters = cuts.size();
  // Sources of each (letter, target), grouped by letter * n + target.
  std::vector<uint32_t> into(letters * n + 1, 0), sources(letters * n);
  {
    std::vector<uint32_t> target(letters * n);
    for (size_t s = 0; s < n; ++s) {
      size_t e = 0;
      const auto& edges = states[s].edges;
      for (size_t a = 0; a < letters; ++a) {
        while (edges[e].hi < cuts[a]) ++e;
        target[s * letters + a] = edges[e].target;
        ++into[a * n + edges[e].target + 1];
      }
    }
    for (size_t k = 0; k + 1 < into.size(); ++k) into[k + 1] += into[k];
    std::vector<uint32_t> fill(into.begin(), into.end() - 1);
    for (size_t s = 0; s < n; ++s)
      for (size_t a = 0; a < letters; ++a) sources[fill[a * n + target[s * letters + a]]++] = static_cast<uint32_t>(s);
  }
  std::vector<std::vector<uint32_t>> members(n);
  for (size_t s = 0; s < n; ++s) members[cls[s]].push_back(static_cast<uint32_t>(s));
  std::vector<uint8_t> waiting(n * letters, 0);  // (class, letter) is on the work list
  std::vector<std::pair<uint32_t, uint32_t>> work;
  size_t largest = 0;
  for (size_t c = 1; c < count; ++c)
    if (members[c].size() > members[largest].size()) largest = c;
  for (size_t c = 0; c < count; ++c) {
    if (c == largest) continue;
    for (size_t a = 0; a < letters; ++a) {
      waiting[c * letters + a] = 1;
      work.emplace_back(static_cast<uint32_t>(c), static_cast<uint32_t>(a));
    }
  }
  std::vector<std::vector<uint32_t>> marked(n);
  std::vector<uint32_t> touched;
  while (!work.empty()) {
    const auto [splitter, a] = work.back();
    work.pop_back();
    waiting[splitter * letters + a] = 0;
    touched.clear();
    for (const uint32_t t : members[splitter]) {
      for (uint32_t k = into[a * n + t]; k < into[a * n + t + 1]; ++k) {
        const uint32_t s = sources[k];
        if (marked[cls[s]].empty()) touched.push_back(cls[s]);
        marked[cls[s]].push_back(s);
      }
    }
    for (const uint32_t c : touched) {
      std::vector<uint32_t>& in = marked[c];
      if (in.size() < members[c].size()) {
        const auto fresh = static_cast<uint32_t>(count++);
        for (const uint32_t s : in) cls[s] = fresh;
        members[fresh] = std::move(in);
        std::erase_if(members[c], [&](uint32_t s) { return cls[s] == fresh; });
        const uint32_t smaller = members[fresh].size() < members[c].size() ? fresh : c;
        for (size_t b = 0; b < letters; ++b) {
          const uint32_t add = waiting[c * letters + b] ? fresh : smaller;
          waiting[add * letters + b] = 1;
          work.emplace_back(add, static_cast<uint32_t>(b));
        }
      }
      in.clear();
    }
  }
  return count;
}

}  // namespace

RegexLanguage RegexLanguage::minimized(std::vector<State> states) {
  const size_t n = states.size();
  const std::vector<bool> live = live_states(states);
  // Refinement's tables take a cell per state and letter.
  const std::vector<uint32_t> cuts = n <= kMinimizeLimit ? letter_cuts(states) : std::vector<uint32_t>{};
  const bool refine = n <= kMinimizeLimit && n * cuts.size() <= kMinimizeCells;
  std::vector<uint32_t> cls(n);
  std::map<uint32_t, uint32_t> first_ids;
  for (size_t s = 0; s < n; ++s) {
    // Unrefined, every live state is a class of its own.
    const auto kind = static_cast<uint32_t>(!live[s] ? 0 : refine ? (states[s].accepting ? 1 : 2) : 1 + s);
    cls[s] = first_ids.try_emplace(kind, static_cast<uint32_t>(first_ids.size())).first->second;
  }
  size_t count = first_ids.size();
  if (refine) count = refine_classes(states, cuts, cls, count);
  // Number the classes in the order a walk from the start meets them.
  std::vector<uint32_t> number(count, UINT32_MAX);
  std::vector<uint32_t> representative;
  number[cls[0]] = 0;
  representative.push_back(0);
  std::vector<State> out;
  for (size_t i = 0; i < representative.size(); ++i) {
    const State& from = states[representative[i]];
    State state;
    state.accepting = from.accepting;
    for (const Edge& e : from.edges) {
      uint32_t& target = number[cls[e.target]];
      if (target == UINT32_MAX) {
        target = static_cast<uint32_t>(representative.size());
        representative.push_back(e.target);
      }
      if (!state.edges.empty() && state.edges.back().target == target) {
        state.edges.back().hi = e.hi;
      } else {
        state.edges.push_back({e.lo, e.hi, target});
      }
    }
    out.push_back(std::move(state));
  }
  return RegexLanguage(std::move(out));
}

// Every state is reachable, so these hold for automata minimized() left
// unminimized too.
bool RegexLanguage::empty() const {
  return std::none_of(states_.begin(), states_.end(), [](const State& s) { return s.accepting; });
}

bool RegexLanguage::is_all() const {
  return std::all_of(states_.begin(), states_.end(), [](const State& s) { return s.accepting; });
}

bool RegexLanguage::contains(std::string_view utf8) const {
  if (unicode::find_invalid_utf8(utf8) != std::string::npos) return false;
  uint32_t state = 0;
  size_t pos = 0;
  char32_t c = 0;
  while (unicode::decode_utf8(utf8, pos, c)) state = next(state, static_cast<uint32_t>(c));
  return states_[state].accepting;
}

uint32_t RegexLanguage::next(uint32_t state, uint32_t c) const {
  const std::vector<Edge>& edges = states_[state].edges;
  const auto it = std::upper_bound(edges.begin(), edges.end(), c, [](uint32_t value, const Edge& e) { return value < e.lo; });
  return std::prev(it)->target;
}

std::optional<int64_t> RegexLanguage::shortest() const {
  // Breadth first from the start: the first accepting state met is the
  // nearest.
  std::vector<int64_t> depth(states_.size(), -1);
  std::vector<uint32_t> queue{0};
  depth[0] = 0;
  for (size_t i = 0; i < queue.size(); ++i) {
    const uint32_t s = queue[i];
    if (states_[s].accepting) return depth[s];
    for (const Edge& e : states_[s].edges) {
      if (depth[e.target] >= 0) continue;
      depth[e.target] = depth[s] + 1;
      queue.push_back(e.target);
    }
  }
  return std::nullopt;
}

RegexRules RegexLanguage::to_ebnf(bool json_escaped, std::string_view prefix) const {
  check_rule_prefix(prefix);
  BASALT_CHECK(!empty(), "regex: the combined patterns match no text");
  // Live states can still reach acceptance; the rest are never entered.
  const size_t n = states_.size();
  const std::vector<bool> live = live_states(states_);
  // A state that only ends is written as nothing after the code point that
  // enters it.
  std::vector<bool> only_ends(n, false);
  for (size_t s = 0; s < n; ++s) {
    only_ends[s] = states_[s].accepting && std::none_of(states_[s].edges.begin(), states_[s].edges.end(),
                                                        [&](const Edge& e) { return live[e.target]; });
  }
  const auto name = [&](uint32_t s) {
    return s == 0 ? fmt::format("{}root", prefix) : fmt::format("{}q{}", prefix, s);
  };
  Emitter emitter(json_escaped, prefix);
  std::string rules;
  for (uint32_t s = 0; s < n; ++s) {
    if (!live[s] || (s != 0 && only_ends[s])) continue;
    std::map<uint32_t, Ranges> by_target;
    for (const Edge& e : states_[s].edges)
      if (live[e.target]) by_target[e.target].emplace_back(e.lo, e.hi);
    // A state's loop onto itself is a repetition inside its rule (q ::= a q
    // | b r  is  q ::= a* (b r)): text that stays in the state, a word's
    // letters or a path's characters, then crosses no rule call per code
    // point, which token masks would walk through one by one.
    std::string loop;
    std::string body;
    for (auto& [target, ranges] : by_target) {
      const Ranges set = normalize(std::move(ranges));
      if (set.empty()) continue;  // surrogates only
      if (target == s) {
        loop = parenthesized(emitter.emit_set(set), Expr::Binding::kPrimary) + "*";
        continue;
      }
      if (!body.empty()) body += " | ";
      body += parenthesized(emitter.emit_set(set), Expr::Binding::kSequence);
      if (!only_ends[target]) body += " " + name(target);
    }
    if (states_[s].accepting) body += body.empty() ? ebnf_literal("") : " | " + ebnf_literal("");
    if (!loop.empty()) body = body == ebnf_literal("") ? loop : fmt::format("{} ({})", loop, body);
    rules += fmt::format("{} ::= {}\n", name(s), body);
  }
  RegexRules result;
  result.root = name(0);
  result.rules = rules + emitter.helper_rules();
  return result;
}

}  // namespace basalt

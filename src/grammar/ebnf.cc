#include "grammar/ebnf.h"

#include <algorithm>
#include <charconv>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace basalt {
namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
         c == '.';
}

// A recursive-descent parser over the text's bytes; positions are reported
// as line:column (1-based, columns in bytes).
class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Grammar parse(std::string_view root_name) {
    Grammar g;
    std::unordered_map<std::string, int32_t> index;
    skip_space();
    while (!at_end()) {
      const size_t start = pos_;
      std::string name = parse_name();
      if (name.empty()) error(start, "expected a rule name");
      skip_space();
      if (text_.substr(pos_, 3) != "::=") error(pos_, "expected ::= after the rule name \"{}\"", name);
      pos_ += 3;
      if (index.contains(name)) error(start, "rule \"{}\" is defined twice", name);
      index.emplace(name, static_cast<int32_t>(g.rules.size()));
      g.rules.push_back({name, parse_choice(/*nested=*/false)});
      skip_space();
    }
    if (g.rules.empty()) fail("grammar: no rules");
    // References are resolved once every rule is known (forward references
    // are the norm).
    for (GrammarRule& rule : g.rules) resolve(rule.body, index);
    const auto root = index.find(std::string(root_name));
    if (root == index.end()) fail("grammar: no rule named \"{}\" to start from", root_name);
    g.root = root->second;
    return g;
  }

 private:
  template <typename... Args>
  [[noreturn]] void error(size_t at, fmt::format_string<Args...> format, Args&&... args) const {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    fail("grammar: {}:{}: {}", line, column, fmt::format(format, std::forward<Args>(args)...));
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  void skip_space() {
    while (!at_end()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && text_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  // Whether a new rule ("NAME ::=") starts here; the position is kept.
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < text_.size() && is_name_char(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t')) ++p;
    return text_.substr(p, 3) == "::=";
  }

  GrammarExpr parse_choice(bool nested) {
    GrammarExpr choice;
    choice.kind = GrammarExpr::Kind::kChoice;
    choice.children.push_back(parse_sequence(nested));
    while (peek() == '|') {
      ++pos_;
      choice.children.push_back(parse_sequence(nested));
    }
    if (choice.children.size() == 1) return std::move(choice.children[0]);
    return choice;
  }

  GrammarExpr parse_sequence(bool nested) {
    GrammarExpr seq;
    seq.kind = GrammarExpr::Kind::kSequence;
    for (;;) {
      skip_space();
      if (at_end()) break;
      const char c = peek();
      if (c == '|') break;
      if (c == ')') {
        if (!nested) error(pos_, "unbalanced )");
        break;
      }
      if (!nested && at_rule_start()) break;
      GrammarExpr item = parse_primary();
      parse_quantifiers(item);
      seq.children.push_back(std::move(item));
    }
    if (seq.children.size() == 1) return std::move(seq.children[0]);
    return seq;
  }

  void parse_quantifiers(GrammarExpr& item) {
    for (int stacked = 0;; ++stacked) {
      const char c = peek();
      int32_t min, max;
      const size_t at = pos_;
      if (c == '*') {
        min = 0, max = -1;
        ++pos_;
      } else if (c == '+') {
        min = 1, max = -1;
        ++pos_;
      } else if (c == '?') {
        min = 0, max = 1;
        ++pos_;
      } else if (c == '{') {
        ++pos_;
        skip_space();
        min = parse_count();
        skip_space();
        max = min;
        if (peek() == ',') {
          ++pos_;
          skip_space();
          max = peek() == '}' ? -1 : parse_count();
          skip_space();
        }
        if (peek() != '}') error(pos_, "expected }} to close the repetition");
        ++pos_;
        if (max >= 0 && max < min) error(at, "repetition {{{},{}}} has its maximum below its minimum", min, max);
      } else {
        return;
      }
      // Each quantifier nests the item once more (see kMaxGroupNesting).
      if (stacked == kMaxGroupNesting) error(at, "more than {} quantifiers in a row", kMaxGroupNesting);
      GrammarExpr rep;
      rep.kind = GrammarExpr::Kind::kRepeat;
      rep.min = min;
      rep.max = max;
      rep.children.push_back(std::move(item));
      item = std::move(rep);
    }
  }

  int32_t parse_count() {
    const size_t start = pos_;
    int64_t value = 0;
    while (!at_end() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      value = value * 10 + (text_[pos_] - '0');
      if (value > kMaxRepetition) error(start, "repetition bound past the limit of {}", kMaxRepetition);
      ++pos_;
    }
    if (pos_ == start) error(start, "expected a number in the repetition");
    return static_cast<int32_t>(value);
  }

  GrammarExpr parse_primary() {
    const size_t start = pos_;
    const char c = peek();
    GrammarExpr e;
    if (c == '"') {
      ++pos_;
      e.kind = GrammarExpr::Kind::kBytes;
      while (peek() != '"') {
        if (at_end()) error(start, "unterminated literal");
        if (peek() == '\\') {
          const size_t esc = pos_;
          const auto [value, is_byte] = parse_escape();
          if (is_byte) {
            e.bytes.push_back(static_cast<char>(value));
          } else {
            check_scalar(value, esc);
            unicode::append_utf8(static_cast<char32_t>(value), e.bytes);
          }
        } else {
          e.bytes.push_back(text_[pos_++]);
        }
      }
      ++pos_;
      return e;
    }
    if (c == '[') return parse_class();
    if (c == '.') {
      ++pos_;
      e.kind = GrammarExpr::Kind::kClass;
      e.ranges = {{0, 0x10FFFF}};
      return e;
    }
    if (c == '(') {
      // Parsing, compiling and freeing a group recurse into it: the nesting
      // a request can send is bounded, as a regex's is.
      if (++depth_ > kMaxGroupNesting) error(start, "groups nested deeper than {}", kMaxGroupNesting);
      ++pos_;
      e = parse_choice(/*nested=*/true);
      --depth_;
      skip_space();
      if (peek() != ')') error(start, "unbalanced (");
      ++pos_;
      return e;
    }
    if (is_name_char(c)) {
      e.kind = GrammarExpr::Kind::kRuleRef;
      e.bytes = parse_name();  // the name until resolve() replaces it by an index
      return e;
    }
    error(start, "unexpected character '{}'", c);
  }

  GrammarExpr parse_class() {
    const size_t start = pos_;
    ++pos_;  // [
    GrammarExpr e;
    e.kind = GrammarExpr::Kind::kClass;
    if (peek() == '^') {
      e.negated = true;
      ++pos_;
    }
    while (peek() != ']') {
      if (at_end()) error(start, "unterminated character class");
      const uint32_t lo = parse_class_char();
      uint32_t hi = lo;
      if (peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        const size_t at = pos_;
        hi = parse_class_char();
        if (hi < lo) error(at, "range U+{:04X}-U+{:04X} is empty", lo, hi);
      }
      e.ranges.emplace_back(lo, hi);
    }
    ++pos_;
    if (e.ranges.empty() && !e.negated) error(start, "empty character class");
    return e;
  }

  uint32_t parse_class_char() {
    const size_t at = pos_;
    uint32_t cp;
    if (peek() == '\\') {
      cp = parse_escape().first;
    } else {
      cp = decode_utf8_at(at);
    }
    check_scalar(cp, at);
    return cp;
  }

  uint32_t decode_utf8_at(size_t at) {
    const auto b0 = static_cast<uint8_t>(text_[pos_]);
    int extra = b0 < 0x80 ? 0 : (b0 >> 5) == 0x6 ? 1 : (b0 >> 4) == 0xE ? 2 : (b0 >> 3) == 0x1E ? 3 : -1;
    if (extra < 0) error(at, "invalid UTF-8 in a character class");
    uint32_t cp = extra == 0 ? b0 : b0 & (0x3F >> extra);
    ++pos_;
    for (int i = 0; i < extra; ++i) {
      if (at_end()) error(at, "invalid UTF-8 in a character class");
      const auto b = static_cast<uint8_t>(text_[pos_++]);
      if ((b & 0xC0) != 0x80) error(at, "invalid UTF-8 in a character class");
      cp = (cp << 6) | (b & 0x3F);
    }
    return cp;
  }

  void check_scalar(uint32_t cp, size_t at) const {
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) error(at, "U+{:X} is not a Unicode scalar value", cp);
  }

  // An escape at pos_ (the backslash): its value, and whether it is a raw
  // byte (\xHH) rather than a code point.
  std::pair<uint32_t, bool> parse_escape() {
    const size_t at = pos_;
    ++pos_;
    if (at_end()) error(at, "unterminated escape");
    const char c = text_[pos_++];
    switch (c) {
      case 'n': return {'\n', false};
      case 'r': return {'\r', false};
      case 't': return {'\t', false};
      case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/':
        return {static_cast<uint32_t>(c), false};
      case 'x': return {parse_hex(2, at), true};
      case 'u': return {parse_hex(4, at), false};
      case 'U': return {parse_hex(8, at), false};
      default: error(at, "unknown escape \\{}", c);
    }
  }

  uint32_t parse_hex(int digits, size_t at) {
    uint32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      if (at_end()) error(at, "expected {} hex digits", digits);
      const char c = text_[pos_++];
      int d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        d = c - 'A' + 10;
      } else {
        error(at, "expected {} hex digits", digits);
      }
      if (value > 0x10FFFFFu) error(at, "escape value too large");
      value = value * 16 + static_cast<uint32_t>(d);
    }
    return value;
  }

  void resolve(GrammarExpr& e, const std::unordered_map<std::string, int32_t>& index) {
    if (e.kind == GrammarExpr::Kind::kRuleRef) {
      const auto it = index.find(e.bytes);
      if (it == index.end()) fail("grammar: rule \"{}\" is referenced but not defined", e.bytes);
      e.rule = it->second;
      e.bytes.clear();
      return;
    }
    for (GrammarExpr& child : e.children) resolve(child, index);
  }

  std::string_view text_;
  size_t pos_ = 0;
  int depth_ = 0;
  static constexpr int kMaxGroupNesting = 1000;
};

}  // namespace

int32_t Grammar::find(std::string_view name) const {
  for (size_t i = 0; i < rules.size(); ++i)
    if (rules[i].name == name) return static_cast<int32_t>(i);
  return -1;
}

Grammar parse_ebnf(std::string_view text, std::string_view root_name) { return Parser(text).parse(root_name); }

std::string ebnf_literal(std::string_view value) {
  std::string out = "\"";
  for (const char ch : value) {
    const auto c = static_cast<uint8_t>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7F) {
          out += fmt::format("\\x{:02X}", c);
        } else {
          out.push_back(ch);  // UTF-8 passes through as bytes
        }
    }
  }
  out.push_back('"');
  return out;
}

std::optional<int64_t> bounded_rule_limit(std::string_view name) {
  const size_t at = name.find(kBoundedRulePrefix);
  if (at == std::string_view::npos) return std::nullopt;
  const std::string_view rest = name.substr(at + kBoundedRulePrefix.size());
  int64_t limit = 0;
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), limit);
  if (error != std::errc() || end == rest.data() || limit < 0) return std::nullopt;
  if (std::string_view(end, static_cast<size_t>(rest.data() + rest.size() - end)).substr(0, 2) != "..")
    return std::nullopt;
  return limit;
}

}  // namespace basalt

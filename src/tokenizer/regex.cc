#include "tokenizer/regex.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>
#include <utility>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace basalt {

using unicode::CategoryMask;

namespace {

constexpr int kUnbounded = std::numeric_limits<int>::max();
// Backtracking recursion deeper than this means a pattern with a repeated
// group ran over a very long input; failing loudly beats a stack overflow.
constexpr int kMaxDepth = 4000;

struct CharClass {
  std::vector<std::pair<char32_t, char32_t>> ranges;
  CategoryMask categories = 0;                   // \p{..} items
  std::vector<CategoryMask> negated_categories;  // \P{..} items
  bool space = false, not_space = false;
  bool negated = false;
  bool icase = false;

  bool matches_exact(char32_t c) const {
    for (const auto& [lo, hi] : ranges) {
      if (c >= lo && c <= hi) return true;
    }
    if (categories != 0 && unicode::in_categories(c, categories)) return true;
    for (CategoryMask m : negated_categories) {
      if (!unicode::in_categories(c, m)) return true;
    }
    if (space && unicode::is_white_space(c)) return true;
    if (not_space && !unicode::is_white_space(c)) return true;
    return false;
  }

  bool matches(char32_t c) const {
    bool hit = matches_exact(c);
    if (!hit && icase) {
      char32_t folded = unicode::simple_fold(c);
      hit = (folded != c && matches_exact(folded)) ||
            (folded >= 'a' && folded <= 'z' && matches_exact(folded - 32));
    }
    return hit != negated;
  }
};

enum class Kind : uint8_t {
  kChar,
  kClass,
  kAny,  // '.': anything but '\n'
  kSeq,
  kAlt,
  kRepeat,
  kLookahead,
  kLineStart,
  kLineEnd,
  kTextStart,
  kTextEnd,
};

struct Node {
  explicit Node(Kind k) : kind(k) {}
  Kind kind;
  char32_t ch = 0;
  bool icase = false;
  int class_index = -1;
  std::vector<int> children;  // kSeq, kAlt; kRepeat and kLookahead use children[0]
  int min = 0, max = 0;
  bool greedy = true;
  bool negate = false;  // kLookahead
};

}  // namespace

struct Regex::Program {
  std::string pattern;
  std::vector<Node> nodes;
  std::vector<CharClass> classes;
  int root = -1;
};

namespace {

// ---------------------------------------------------------------------------
// Parser

class Parser {
 public:
  Parser(std::string_view pattern, Regex::Program& program) : pattern_(pattern), prog_(program) {
    size_t pos = 0;
    while (pos < pattern.size()) {
      char32_t cp;
      size_t start = pos;
      if (!unicode::decode_utf8(pattern, pos, cp)) error(start, "pattern is not valid UTF-8");
      cps_.push_back(cp);
      offsets_.push_back(start);
    }
    offsets_.push_back(pattern.size());
  }

  int parse() {
    int root = parse_alternation(false);
    if (i_ < cps_.size()) error(i_, "unbalanced ')'");
    return root;
  }

 private:
  [[noreturn]] void error(size_t index, std::string_view what) const {
    size_t byte = index < offsets_.size() ? offsets_[index] : pattern_.size();
    fail("invalid regex \"{}\" at offset {}: {}", pattern_, byte, what);
  }

  bool at_end() const { return i_ >= cps_.size(); }
  char32_t peek(size_t ahead = 0) const { return i_ + ahead < cps_.size() ? cps_[i_ + ahead] : 0; }
  bool has(size_t ahead) const { return i_ + ahead < cps_.size(); }

  int add(Node node) {
    prog_.nodes.push_back(std::move(node));
    return static_cast<int>(prog_.nodes.size()) - 1;
  }
  int add_class(CharClass cls) {
    prog_.classes.push_back(std::move(cls));
    Node n{Kind::kClass};
    n.class_index = static_cast<int>(prog_.classes.size()) - 1;
    return add(std::move(n));
  }

  int parse_alternation(bool in_group) {
    bool saved_icase = icase_;
    std::vector<int> branches{parse_sequence()};
    while (!at_end() && peek() == '|') {
      ++i_;
      branches.push_back(parse_sequence());
    }
    if (in_group) icase_ = saved_icase;
    if (branches.size() == 1) return branches[0];
    Node n{Kind::kAlt};
    n.children = std::move(branches);
    return add(std::move(n));
  }

  int parse_sequence() {
    std::vector<int> items;
    while (!at_end() && peek() != '|' && peek() != ')') {
      int atom = parse_atom();
      if (atom < 0) continue;  // an inline flag group such as (?i)
      items.push_back(parse_quantifier(atom));
    }
    Node n{Kind::kSeq};
    n.children = std::move(items);
    return add(std::move(n));
  }

  bool parse_number(int& value) {
    if (at_end() || peek() < '0' || peek() > '9') return false;
    int64_t v = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > 100000) error(i_, "repetition count too large");
      ++i_;
    }
    value = static_cast<int>(v);
    return true;
  }

  int parse_quantifier(int atom) {
    while (!at_end()) {
      size_t start = i_;
      char32_t c = peek();
      int min, max;
      if (c == '*') {
        min = 0, max = kUnbounded, ++i_;
      } else if (c == '+') {
        min = 1, max = kUnbounded, ++i_;
      } else if (c == '?') {
        min = 0, max = 1, ++i_;
      } else if (c == '{') {
        ++i_;
        bool has_min = parse_number(min);
        if (!has_min) min = 0;  // {,n} means {0,n}
        max = min;
        if (!at_end() && peek() == ',') {
          ++i_;
          if (!parse_number(max)) {
            if (!has_min) {
              i_ = start;  // "{,}" is no interval: Oniguruma reads the brace as a literal
              return atom;
            }
            max = kUnbounded;
          }
        } else if (!has_min) {
          i_ = start;  // a brace that starts no interval is a literal
          return atom;
        }
        if (at_end() || peek() != '}') {
          i_ = start;
          return atom;
        }
        ++i_;
        if (max < min) error(start, "repetition range {m,n} with n < m");
      } else {
        return atom;
      }
      Kind k = prog_.nodes[atom].kind;
      if (k == Kind::kLineStart || k == Kind::kLineEnd || k == Kind::kTextStart ||
          k == Kind::kTextEnd || k == Kind::kLookahead) {
        error(start, "quantifier after an anchor or lookahead");
      }
      Node n{Kind::kRepeat};
      n.children = {atom};
      n.min = min;
      n.max = max;
      if (!at_end() && peek() == '?') {
        n.greedy = false;
        ++i_;
      } else if (!at_end() && peek() == '+' && c != '{') {
        error(i_, "possessive quantifiers are not supported");
      }
      atom = add(std::move(n));
    }
    return atom;
  }

  int parse_atom() {
    size_t start = i_;
    char32_t c = cps_[i_++];
    switch (c) {
      case '(':
        return parse_group(start);
      case '[':
        return add_class(parse_class(start));
      case '.':
        return add(Node{Kind::kAny});
      case '^':
        return add(Node{Kind::kLineStart});
      case '$':
        return add(Node{Kind::kLineEnd});
      case '\\':
        return parse_escape(start);
      case '*':
      case '+':
      case '?':
        error(start, "quantifier with nothing to repeat");
      default:
        return literal(c);
    }
  }

  int literal(char32_t c) {
    Node n{Kind::kChar};
    n.ch = icase_ ? unicode::simple_fold(c) : c;
    n.icase = icase_;
    return add(std::move(n));
  }

  int parse_group(size_t start) {
    bool negate = false;
    bool lookahead = false;
    bool saved_icase = icase_;
    if (!at_end() && peek() == '?') {
      ++i_;
      char32_t c = at_end() ? 0 : peek();
      if (c == ':') {
        ++i_;
      } else if (c == '=' || c == '!') {
        lookahead = true;
        negate = c == '!';
        ++i_;
      } else if (c == '<' && (peek(1) == '=' || peek(1) == '!')) {
        error(start, "lookbehind is not supported");
      } else if (c == '<' || c == '\'') {
        // Named group: read as a plain group.
        char32_t close = c == '<' ? '>' : '\'';
        ++i_;
        while (!at_end() && peek() != close) ++i_;
        if (at_end()) error(start, "unterminated group name");
        ++i_;
      } else {
        // Inline flags: (?i) (?-i) (?i:...) (?i-m:...)
        bool on = true;
        bool new_icase = icase_;
        while (!at_end() && peek() != ':' && peek() != ')') {
          char32_t f = peek();
          if (f == '-') {
            on = false;
          } else if (f == 'i') {
            new_icase = on;
          } else if (f == 'm' || f == 'x') {
            error(i_, "only the inline flag 'i' is supported");
          } else {
            error(i_, "unknown group syntax");
          }
          ++i_;
        }
        if (at_end()) error(start, "unterminated group");
        if (peek() == ')') {
          // (?i) applies to the rest of the enclosing group.
          ++i_;
          icase_ = new_icase;
          return -1;
        }
        ++i_;  // ':'
        icase_ = new_icase;
      }
    }
    int inner = parse_alternation(true);
    icase_ = saved_icase;
    if (at_end() || peek() != ')') error(start, "missing ')'");
    ++i_;
    if (!lookahead) return inner;
    Node n{Kind::kLookahead};
    n.children = {inner};
    n.negate = negate;
    return add(std::move(n));
  }

  char32_t parse_hex(size_t start, size_t min_digits, size_t max_digits) {
    char32_t v = 0;
    size_t n = 0;
    while (n < max_digits && !at_end() &&
           std::isxdigit(static_cast<int>(peek() < 128 ? peek() : 0))) {
      char32_t d = peek();
      v = v * 16 + (d <= '9' ? d - '0' : (d | 0x20) - 'a' + 10);
      ++n, ++i_;
    }
    if (n < min_digits || v > 0x10FFFF) error(start, "bad hexadecimal escape");
    return v;
  }

  CategoryMask parse_property(size_t start) {
    if (at_end() || peek() != '{') error(start, "expected '{' after \\p");
    ++i_;
    std::string name;
    while (!at_end() && peek() != '}') {
      char32_t c = peek();
      if (c < 128 && c != '_' && c != ' ' && c != '-')
        name.push_back(static_cast<char>(std::tolower(static_cast<int>(c))));
      ++i_;
    }
    if (at_end()) error(start, "unterminated \\p{...}");
    ++i_;
    using unicode::Category;
    using unicode::category_bit;
    static const std::pair<const char*, CategoryMask> kNames[] = {
        {"l", unicode::kLetterMask},
        {"letter", unicode::kLetterMask},
        {"lu", category_bit(Category::kLu)},
        {"uppercaseletter", category_bit(Category::kLu)},
        {"ll", category_bit(Category::kLl)},
        {"lowercaseletter", category_bit(Category::kLl)},
        {"lt", category_bit(Category::kLt)},
        {"titlecaseletter", category_bit(Category::kLt)},
        {"lm", category_bit(Category::kLm)},
        {"modifierletter", category_bit(Category::kLm)},
        {"lo", category_bit(Category::kLo)},
        {"otherletter", category_bit(Category::kLo)},
        {"m", unicode::kMarkMask},
        {"mark", unicode::kMarkMask},
        {"combiningmark", unicode::kMarkMask},
        {"mn", category_bit(Category::kMn)},
        {"nonspacingmark", category_bit(Category::kMn)},
        {"mc", category_bit(Category::kMc)},
        {"spacingmark", category_bit(Category::kMc)},
        {"me", category_bit(Category::kMe)},
        {"enclosingmark", category_bit(Category::kMe)},
        {"n", unicode::kNumberMask},
        {"number", unicode::kNumberMask},
        {"nd", category_bit(Category::kNd)},
        {"decimalnumber", category_bit(Category::kNd)},
        {"nl", category_bit(Category::kNl)},
        {"letternumber", category_bit(Category::kNl)},
        {"no", category_bit(Category::kNo)},
        {"othernumber", category_bit(Category::kNo)},
        {"p", unicode::kPunctuationMask},
        {"punctuation", unicode::kPunctuationMask},
        {"pc", category_bit(Category::kPc)},
        {"connectorpunctuation", category_bit(Category::kPc)},
        {"pd", category_bit(Category::kPd)},
        {"dashpunctuation", category_bit(Category::kPd)},
        {"ps", category_bit(Category::kPs)},
        {"openpunctuation", category_bit(Category::kPs)},
        {"pe", category_bit(Category::kPe)},
        {"closepunctuation", category_bit(Category::kPe)},
        {"pi", category_bit(Category::kPi)},
        {"initialpunctuation", category_bit(Category::kPi)},
        {"pf", category_bit(Category::kPf)},
        {"finalpunctuation", category_bit(Category::kPf)},
        {"po", category_bit(Category::kPo)},
        {"otherpunctuation", category_bit(Category::kPo)},
        {"s", unicode::kSymbolMask},
        {"symbol", unicode::kSymbolMask},
        {"sm", category_bit(Category::kSm)},
        {"mathsymbol", category_bit(Category::kSm)},
        {"sc", category_bit(Category::kSc)},
        {"currencysymbol", category_bit(Category::kSc)},
        {"sk", category_bit(Category::kSk)},
        {"modifiersymbol", category_bit(Category::kSk)},
        {"so", category_bit(Category::kSo)},
        {"othersymbol", category_bit(Category::kSo)},
        {"z", unicode::kSeparatorMask},
        {"separator", unicode::kSeparatorMask},
        {"zs", category_bit(Category::kZs)},
        {"spaceseparator", category_bit(Category::kZs)},
        {"zl", category_bit(Category::kZl)},
        {"lineseparator", category_bit(Category::kZl)},
        {"zp", category_bit(Category::kZp)},
        {"paragraphseparator", category_bit(Category::kZp)},
        {"c", unicode::kOtherMask},
        {"other", unicode::kOtherMask},
        {"cc", category_bit(Category::kCc)},
        {"control", category_bit(Category::kCc)},
        {"cf", category_bit(Category::kCf)},
        {"format", category_bit(Category::kCf)},
        {"cs", category_bit(Category::kCs)},
        {"surrogate", category_bit(Category::kCs)},
        {"co", category_bit(Category::kCo)},
        {"privateuse", category_bit(Category::kCo)},
        {"cn", category_bit(Category::kCn)},
        {"unassigned", category_bit(Category::kCn)},
    };
    for (const auto& [n, mask] : kNames) {
      if (name == n) return mask;
    }
    error(start, "unsupported property (only general categories are supported)");
  }

  // Adds the class that an escape such as \s or \p{L} denotes to cls.
  // Returns false (and sets *literal) when the escape is a single character.
  bool parse_escape_into(size_t start, CharClass& cls, char32_t* literal_out) {
    if (at_end()) error(start, "trailing backslash");
    char32_t c = cps_[i_++];
    switch (c) {
      case 's':
        cls.space = true;
        return true;
      case 'S':
        cls.not_space = true;
        return true;
      case 'd':
        cls.categories |= unicode::category_bit(unicode::Category::kNd);
        return true;
      case 'D':
        cls.negated_categories.push_back(unicode::category_bit(unicode::Category::kNd));
        return true;
      case 'w':
        cls.categories |= unicode::kLetterMask | unicode::kMarkMask |
                          unicode::category_bit(unicode::Category::kNd) |
                          unicode::category_bit(unicode::Category::kPc);
        return true;
      case 'W':
        cls.negated_categories.push_back(unicode::kLetterMask | unicode::kMarkMask |
                                         unicode::category_bit(unicode::Category::kNd) |
                                         unicode::category_bit(unicode::Category::kPc));
        return true;
      case 'p':
      case 'P': {
        bool negated = c == 'P';
        if (has(1) && peek() == '{' && peek(1) == '^') {
          negated = !negated;
          cps_.erase(cps_.begin() + static_cast<std::ptrdiff_t>(i_) + 1);
          offsets_.erase(offsets_.begin() + static_cast<std::ptrdiff_t>(i_) + 1);
        }
        CategoryMask mask = parse_property(start);
        if (negated) {
          cls.negated_categories.push_back(mask);
        } else {
          cls.categories |= mask;
        }
        return true;
      }
      case 'n':
        *literal_out = '\n';
        return false;
      case 'r':
        *literal_out = '\r';
        return false;
      case 't':
        *literal_out = '\t';
        return false;
      case 'f':
        *literal_out = '\f';
        return false;
      case 'v':
        *literal_out = '\v';
        return false;
      case 'a':
        *literal_out = 0x07;
        return false;
      case 'e':
        *literal_out = 0x1B;
        return false;
      case 'x':
        if (!at_end() && peek() == '{') {
          ++i_;
          *literal_out = parse_hex(start, 1, 8);
          if (at_end() || peek() != '}') error(start, "unterminated \\x{...}");
          ++i_;
        } else {
          *literal_out = parse_hex(start, 1, 2);
        }
        return false;
      case 'u':
        *literal_out = parse_hex(start, 4, 4);
        return false;
      default:
        if (c < 128 && std::isalnum(static_cast<int>(c))) error(start, "unsupported escape");
        *literal_out = c;
        return false;
    }
  }

  int parse_escape(size_t start) {
    if (!at_end()) {
      char32_t c = peek();
      if (c == 'A') return ++i_, add(Node{Kind::kTextStart});
      if (c == 'z') return ++i_, add(Node{Kind::kTextEnd});
    }
    CharClass cls;
    char32_t lit = 0;
    if (!parse_escape_into(start, cls, &lit)) return literal(lit);
    cls.icase = icase_;
    return add_class(std::move(cls));
  }

  CharClass parse_class(size_t start) {
    CharClass cls;
    cls.icase = icase_;
    if (!at_end() && peek() == '^') {
      cls.negated = true;
      ++i_;
    }
    bool first = true;
    while (true) {
      if (at_end()) error(start, "missing ']'");
      size_t item = i_;
      char32_t c = cps_[i_++];
      if (c == ']' && !first) break;
      first = false;
      if (c == '[') error(item, "nested character classes are not supported");
      if (c == '&' && !at_end() && peek() == '&')
        error(item, "class intersection is not supported");
      char32_t lo;
      if (c == '\\') {
        if (parse_escape_into(item, cls, &lo)) continue;
      } else {
        lo = c;
      }
      // A range lo-hi, unless '-' is the last character of the class.
      if (has(1) && peek() == '-' && peek(1) != ']') {
        size_t dash = i_;
        ++i_;
        char32_t hi = cps_[i_++];
        if (hi == '\\') {
          CharClass unused;
          if (parse_escape_into(dash, unused, &hi)) error(dash, "range ends in a class escape");
        } else if (hi == '[') {
          error(dash, "nested character classes are not supported");
        }
        if (hi < lo) error(dash, "character range out of order");
        cls.ranges.emplace_back(lo, hi);
      } else {
        cls.ranges.emplace_back(lo, lo);
      }
    }
    return cls;
  }

  std::string_view pattern_;
  Regex::Program& prog_;
  std::vector<char32_t> cps_;
  std::vector<size_t> offsets_;
  size_t i_ = 0;
  bool icase_ = false;
};

// ---------------------------------------------------------------------------
// Matcher

// A non-owning reference to a continuation: "the rest of the pattern matched
// from this position succeeds".
class Cont {
 public:
  template <typename F>
  explicit Cont(const F& f)
      : obj_(&f), call_([](const void* o, size_t p) { return (*static_cast<const F*>(o))(p); }) {}
  bool operator()(size_t pos) const { return call_(obj_, pos); }

 private:
  const void* obj_;
  bool (*call_)(const void*, size_t);
};

class Matcher {
 public:
  Matcher(const Regex::Program& prog, const std::vector<char32_t>& text) : prog_(prog), s_(text) {}

  // The end of the match starting at `start`, if any.
  std::optional<size_t> match_at(size_t start) {
    size_t end = 0;
    auto accept = [&](size_t p) {
      end = p;
      return true;
    };
    if (match(prog_.root, start, Cont(accept))) return end;
    return std::nullopt;
  }

 private:
  bool single_char(const Node& n, size_t pos) const {
    if (pos >= s_.size()) return false;
    char32_t c = s_[pos];
    switch (n.kind) {
      case Kind::kChar:
        return n.icase ? unicode::simple_fold(c) == n.ch : c == n.ch;
      case Kind::kClass:
        return prog_.classes[n.class_index].matches(c);
      case Kind::kAny:
        return c != '\n';
      default:
        return false;
    }
  }
  static bool is_single(const Node& n) {
    return n.kind == Kind::kChar || n.kind == Kind::kClass || n.kind == Kind::kAny;
  }

  struct DepthGuard {
    explicit DepthGuard(int& d) : depth(d) {
      if (++depth > kMaxDepth) {
        --depth;
        fail("regex backtracking too deep for this input (more than {} levels)", kMaxDepth);
      }
    }
    ~DepthGuard() { --depth; }
    int& depth;
  };

  bool match(int index, size_t pos, Cont k) {
    DepthGuard guard(depth_);
    const Node& n = prog_.nodes[index];
    switch (n.kind) {
      case Kind::kChar:
      case Kind::kClass:
      case Kind::kAny:
        return single_char(n, pos) && k(pos + 1);
      case Kind::kSeq:
        return match_seq(n, 0, pos, k);
      case Kind::kAlt:
        for (int child : n.children) {
          if (match(child, pos, k)) return true;
        }
        return false;
      case Kind::kRepeat:
        if (is_single(prog_.nodes[n.children[0]])) return repeat_single(n, pos, k);
        return repeat(n, 0, pos, k);
      case Kind::kLookahead: {
        auto any = [](size_t) { return true; };
        bool found = match(n.children[0], pos, Cont(any));
        return found != n.negate && k(pos);
      }
      case Kind::kLineStart:
        return (pos == 0 || s_[pos - 1] == '\n') && k(pos);
      case Kind::kLineEnd:
        return (pos == s_.size() || s_[pos] == '\n') && k(pos);
      case Kind::kTextStart:
        return pos == 0 && k(pos);
      case Kind::kTextEnd:
        return pos == s_.size() && k(pos);
    }
    return false;
  }

  bool match_seq(const Node& seq, size_t i, size_t pos, Cont k) {
    // Runs of single characters need no backtracking points.
    while (i < seq.children.size() && is_single(prog_.nodes[seq.children[i]])) {
      if (!single_char(prog_.nodes[seq.children[i]], pos)) return false;
      ++i, ++pos;
    }
    if (i == seq.children.size()) return k(pos);
    if (i + 1 == seq.children.size()) return match(seq.children[i], pos, k);
    auto rest = [&](size_t p) { return match_seq(seq, i + 1, p, k); };
    return match(seq.children[i], pos, Cont(rest));
  }

  bool repeat_single(const Node& n, size_t pos, Cont k) {
    const Node& item = prog_.nodes[n.children[0]];
    size_t limit =
        n.max == kUnbounded ? s_.size() - std::min(pos, s_.size()) : static_cast<size_t>(n.max);
    size_t count = 0;
    if (n.greedy) {
      while (count < limit && single_char(item, pos + count)) ++count;
      if (count < static_cast<size_t>(n.min)) return false;
      for (size_t c = count + 1; c-- > static_cast<size_t>(n.min);) {
        if (k(pos + c)) return true;
      }
      return false;
    }
    while (count < static_cast<size_t>(n.min)) {
      if (!single_char(item, pos + count)) return false;
      ++count;
    }
    while (true) {
      if (k(pos + count)) return true;
      if (count >= limit || !single_char(item, pos + count)) return false;
      ++count;
    }
  }

  bool repeat(const Node& n, int count, size_t pos, Cont k) {
    auto next = [&](size_t p) {
      // An iteration that consumed nothing would loop forever; it counts as
      // having satisfied the minimum.
      if (p == pos) return count + 1 >= n.min ? k(p) : repeat(n, count + 1, p, k);
      return repeat(n, count + 1, p, k);
    };
    if (n.greedy) {
      if (count < n.max && match(n.children[0], pos, Cont(next))) return true;
      return count >= n.min && k(pos);
    }
    if (count >= n.min && k(pos)) return true;
    return count < n.max && match(n.children[0], pos, Cont(next));
  }

  const Regex::Program& prog_;
  const std::vector<char32_t>& s_;
  int depth_ = 0;
};

// Code points of text and the byte offset of each (plus one past the end).
// Invalid bytes decode as U+FFFD one byte at a time so offsets stay exact.
void decode(std::string_view text, std::vector<char32_t>& cps, std::vector<size_t>& offsets) {
  cps.clear();
  offsets.clear();
  size_t pos = 0;
  while (pos < text.size()) {
    offsets.push_back(pos);
    char32_t cp;
    if (!unicode::decode_utf8(text, pos, cp)) {
      cp = unicode::kReplacementChar;
      ++pos;
    }
    cps.push_back(cp);
  }
  offsets.push_back(text.size());
}

}  // namespace

Regex Regex::compile(std::string_view pattern) {
  auto program = std::make_shared<Program>();
  program->pattern = std::string(pattern);
  Parser parser(pattern, *program);
  program->root = parser.parse();
  return Regex(std::move(program));
}

Regex Regex::literal(std::string_view literal) {
  std::string escaped;
  for (char c : literal) {
    if (std::string_view("\\.+*?()|[]{}^$#&-~").find(c) != std::string_view::npos)
      escaped.push_back('\\');
    escaped.push_back(c);
  }
  return compile(escaped);
}

const std::string& Regex::pattern() const { return program_->pattern; }

std::optional<Regex::Span> Regex::find(std::string_view text, size_t from) const {
  std::vector<char32_t> cps;
  std::vector<size_t> offsets;
  decode(text, cps, offsets);
  size_t start = std::lower_bound(offsets.begin(), offsets.end(), from) - offsets.begin();
  Matcher matcher(*program_, cps);
  for (size_t s = start; s <= cps.size(); ++s) {
    if (auto end = matcher.match_at(s)) return Span{offsets[s], offsets[*end]};
  }
  return std::nullopt;
}

std::vector<Regex::Span> Regex::find_all(std::string_view text) const {
  std::vector<char32_t> cps;
  std::vector<size_t> offsets;
  decode(text, cps, offsets);
  Matcher matcher(*program_, cps);
  std::vector<Span> spans;
  size_t search_from = 0;  // code point index
  std::optional<size_t> last_match_end;
  while (search_from <= cps.size()) {
    std::optional<std::pair<size_t, size_t>> found;
    for (size_t s = search_from; s <= cps.size(); ++s) {
      if (auto end = matcher.match_at(s)) {
        found.emplace(s, *end);
        break;
      }
    }
    if (!found) break;
    auto [s, e] = *found;
    if (s == e && last_match_end == e) {
      // No empty match right after the previous match: step one character on.
      ++search_from;
      continue;
    }
    search_from = e;
    last_match_end = e;
    spans.push_back(Span{offsets[s], offsets[e]});
  }
  return spans;
}

}  // namespace basalt

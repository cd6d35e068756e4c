// Lexer and parser for Jinja templates (see ast.h). The lexer follows
// jinja2's rules for the HF environment: `{%`/`{{`/`{#` open tags, `-` and `+`
// modifiers control whitespace, lstrip_blocks strips a block or comment tag's
// indentation, trim_blocks drops the newline after a block or comment tag,
// "\r\n" and "\r" become "\n", and one trailing newline of the source is
// dropped (keep_trailing_newline=False).
#include <fmt/format.h>

#include <cstring>

#include "core/error.h"
#include "template/ast.h"

namespace basalt::jinja {

namespace {

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Token(Tok type, std::string text, int line) : type(type), text(std::move(text)), line(line) {}
  Tok type;
  std::string text;  // Text content, name, operator, decoded string
  int line = 0;
  int64_t int_value = 0;
  double float_value = 0;
};

[[noreturn]] void syntax_error(int line, const std::string& message) {
  fail("jinja template line {}: syntax error: {}", line, message);
}

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python's str.rstrip() / "only whitespace" on UTF-8 text.
std::string rstrip_py(const std::string& s) {
  auto cps = utf8_decode(s);
  size_t end = cps.size();
  while (end > 0 && py_isspace(cps[end - 1])) --end;
  if (end == cps.size()) return s;
  return utf8_encode(std::u32string_view(cps).substr(0, end));
}

bool all_space_py(std::string_view s) {
  for (char32_t c : utf8_decode(s)) {
    if (!py_isspace(c)) return false;
  }
  return true;
}

int count_newlines(std::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Normalize newlines, then drop one trailing newline.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) lex_data();
    tokens_.push_back({Tok::Eof, "", line_});
    return std::move(tokens_);
  }

 private:
  void emit(Tok type, std::string text, int line) { tokens_.push_back({type, std::move(text), line}); }

  void lex_data() {
    size_t start = pos_;
    bool line_starting = start == 0 || src_[start - 1] == '\n';
    size_t at = start;
    while (true) {
      at = src_.find('{', at);
      if (at == std::string::npos || at + 1 >= src_.size()) {
        at = std::string::npos;
        break;
      }
      char n = src_[at + 1];
      if (n == '{' || n == '%' || n == '#') break;
      ++at;
    }
    if (at == std::string::npos) {
      std::string text = src_.substr(start);
      emit(Tok::Text, text, line_);
      line_ += count_newlines(text);
      pos_ = src_.size();
      return;
    }
    std::string text = src_.substr(start, at - start);
    int text_line = line_;
    line_ += count_newlines(text);
    char kind = src_[at + 1];
    char modifier = at + 2 < src_.size() ? src_[at + 2] : '\0';
    if (modifier == '-') {
      text = rstrip_py(text);
    } else if (modifier != '+' && kind != '{') {
      // lstrip_blocks: drop the tag's indentation when only whitespace
      // precedes it on its line.
      size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
      if ((l_pos > 0 || line_starting) && all_space_py(std::string_view(text).substr(l_pos))) {
        text.resize(l_pos);
      }
    }
    if (!text.empty()) emit(Tok::Text, std::move(text), text_line);
    pos_ = at + 2 + ((modifier == '-' || modifier == '+') ? 1 : 0);
    if (kind == '#') {
      lex_comment();
    } else {
      lex_tag(kind == '{');
    }
  }

  // After `%}`/`#}`: `-` strips all following whitespace, `+` keeps it, and
  // otherwise trim_blocks drops one newline.
  void after_block_end(char modifier) {
    if (modifier == '-') {
      size_t end = pos_;
      // Python's \s on str: include Unicode spaces.
      while (end < src_.size()) {
        if (is_ascii_space(src_[end])) {
          ++end;
          continue;
        }
        auto rest = utf8_decode(std::string_view(src_).substr(end, 4));
        if (!rest.empty() && rest[0] != U'\uFFFD' && py_isspace(rest[0])) {
          std::string one;
          utf8_append(one, rest[0]);
          end += one.size();
          continue;
        }
        break;
      }
      line_ += count_newlines(std::string_view(src_).substr(pos_, end - pos_));
      pos_ = end;
    } else if (modifier != '+' && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      ++line_;
    }
  }

  void lex_comment() {
    int start_line = line_;
    size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) syntax_error(start_line, "missing end of comment tag");
    char modifier = '\0';
    if (end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+')) modifier = src_[end - 1];
    line_ += count_newlines(std::string_view(src_).substr(pos_, end - pos_));
    pos_ = end + 2;
    after_block_end(modifier);
  }

  void lex_tag(bool variable) {
    int depth = 0;
    emit(variable ? Tok::VarBegin : Tok::BlockBegin, "", line_);
    const char* close = variable ? "}}" : "%}";
    while (true) {
      while (pos_ < src_.size() && is_ascii_space(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) {
        syntax_error(line_, fmt::format("unexpected end of template, expected '{}'", close));
      }
      if (depth == 0) {
        char m = src_[pos_];
        size_t skip = (m == '-' || (m == '+' && !variable)) ? 1 : 0;
        if (src_.compare(pos_ + skip, 2, close) == 0) {
          pos_ += skip + 2;
          emit(variable ? Tok::VarEnd : Tok::BlockEnd, "", line_);
          if (variable) {
            if (skip) after_block_end('-');
          } else {
            after_block_end(skip ? m : '\0');
          }
          return;
        }
      }
      lex_token(depth);
    }
  }

  void lex_token(int& depth) {
    char c = src_[pos_];
    int line = line_;
    if (is_name_start(c)) {
      size_t end = pos_;
      while (end < src_.size() && is_name_char(src_[end])) ++end;
      emit(Tok::Name, src_.substr(pos_, end - pos_), line);
      pos_ = end;
      return;
    }
    if (is_digit(c)) {
      lex_number();
      return;
    }
    if (c == '\'' || c == '"') {
      lex_string();
      return;
    }
    static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "*", "/", "%", "~", "<",
                                       ">",  "=",  ".",  ",",  ":",  "|",  "(", ")", "[", "]", "{", "}", ";"};
    for (const char* op : kOps) {
      size_t n = std::strlen(op);
      if (src_.compare(pos_, n, op) == 0) {
        if (op[0] == '(' || op[0] == '[' || op[0] == '{') ++depth;
        if (op[0] == ')' || op[0] == ']' || op[0] == '}') {
          if (depth == 0) syntax_error(line, fmt::format("unexpected '{}'", op));
          --depth;
        }
        emit(Tok::Op, op, line);
        pos_ += n;
        return;
      }
    }
    syntax_error(line, fmt::format("unexpected character '{}'", c));
  }

  size_t digits_at(size_t p) const {
    // \d+(_\d+)*
    size_t start = p;
    while (p < src_.size() && is_digit(src_[p])) {
      ++p;
      if (p + 1 < src_.size() && src_[p] == '_' && is_digit(src_[p + 1])) ++p;
    }
    return p - start;
  }

  void lex_number() {
    int line = line_;
    size_t p = pos_ + digits_at(pos_);
    bool is_float = false;
    if (p + 1 < src_.size() && src_[p] == '.' && is_digit(src_[p + 1])) {
      is_float = true;
      p += 1 + digits_at(p + 1);
    }
    if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      size_t n = digits_at(q);
      if (n > 0) {
        is_float = true;
        p = q + n;
      }
    }
    std::string text;
    for (size_t i = pos_; i < p; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    pos_ = p;
    Token tok{is_float ? Tok::Float : Tok::Int, text, line};
    if (is_float) {
      tok.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      char* end = nullptr;
      long long v = std::strtoll(text.c_str(), &end, 10);
      if (errno == ERANGE) syntax_error(line, fmt::format("integer literal {} is too large", text));
      tok.int_value = v;
    }
    tokens_.push_back(std::move(tok));
  }

  void lex_string() {
    int line = line_;
    char quote = src_[pos_];
    size_t p = pos_ + 1;
    std::string out;
    while (true) {
      if (p >= src_.size()) syntax_error(line, "unterminated string literal");
      char c = src_[p];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out += c;
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) syntax_error(line, "unterminated string literal");
      char e = src_[p + 1];
      p += 2;
      auto hex = [&](int n) -> char32_t {
        char32_t v = 0;
        for (int i = 0; i < n; ++i) {
          if (p >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[p]))) {
            syntax_error(line, "truncated \\x, \\u or \\U escape in string literal");
          }
          char h = src_[p++];
          v = v * 16 + static_cast<char32_t>(is_digit(h) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        return v;
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\n': ++line_; break;  // line continuation
        case 'x': utf8_append(out, hex(2)); break;
        case 'u': utf8_append(out, hex(4)); break;
        case 'U': {
          char32_t v = hex(8);
          if (v > 0x10FFFF) syntax_error(line, "illegal \\U escape in string literal");
          utf8_append(out, v);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = static_cast<char32_t>(e - '0');
            for (int i = 0; i < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++i) {
              v = v * 8 + static_cast<char32_t>(src_[p++] - '0');
            }
            utf8_append(out, v);
          } else {
            out += '\\';
            out += e;
            if (e == '\n') ++line_;
          }
      }
    }
    pos_ = p + 1;
    emit(Tok::String, std::move(out), line);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

// ---------------------------------------------------------------- parser

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Body parse_all() {
    Body body = subparse({});
    if (cur().type != Tok::Eof) {
      syntax_error(cur().line, fmt::format("unexpected '{}'", describe(cur())));
    }
    return body;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : p(p) {
      if (++p.depth_ > kMaxParseDepth) syntax_error(p.cur().line, "template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
    Parser& p;
  };

  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t n = 1) const { return toks_[std::min(pos_ + n, toks_.size() - 1)]; }
  Token next() { return toks_[pos_ < toks_.size() - 1 ? pos_++ : pos_]; }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Text: return "text";
      case Tok::VarBegin: return "{{";
      case Tok::VarEnd: return "}}";
      case Tok::BlockBegin: return "{%";
      case Tok::BlockEnd: return "%}";
      case Tok::Eof: return "end of template";
      case Tok::String: return "string";
      default: return t.text;
    }
  }

  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == Tok::Name && cur().text == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++pos_;
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    ++pos_;
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) syntax_error(cur().line, fmt::format("expected '{}', got '{}'", op, describe(cur())));
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) syntax_error(cur().line, fmt::format("expected a name, got '{}'", describe(cur())));
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) {
      syntax_error(cur().line, fmt::format("expected end of statement '%}}', got '{}'", describe(cur())));
    }
    ++pos_;
  }

  // ---- statements

  // Parses until `{% <one of ends>`; leaves the position on that name.
  Body subparse(const std::vector<std::string>& ends) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (!ends.empty()) {
          syntax_error(t.line, fmt::format("unexpected end of template, expected '{}'", fmt::join(ends, "' or '")));
        }
        return body;
      }
      if (t.type == Tok::Text) {
        auto s = std::make_unique<Stmt>(Stmt::Kind::Text);
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        ++pos_;
      } else if (t.type == Tok::VarBegin) {
        ++pos_;
        auto s = std::make_unique<Stmt>(Stmt::Kind::Output);
        s->line = t.line;
        s->expr = parse_tuple(true, {});
        if (cur().type != Tok::VarEnd) {
          syntax_error(cur().line, fmt::format("expected end of print statement '}}}}', got '{}'", describe(cur())));
        }
        ++pos_;
        body.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        const Token& name = peek();
        if (name.type != Tok::Name) syntax_error(name.line, "expected a statement name after '{%'");
        for (const auto& e : ends) {
          if (name.text == e) {
            ++pos_;
            return body;
          }
        }
        ++pos_;
        body.push_back(parse_statement());
      } else {
        syntax_error(t.line, fmt::format("unexpected '{}'", describe(t)));
      }
    }
  }

  StmtPtr make_stmt(Stmt::Kind kind, int line) {
    auto s = std::make_unique<Stmt>(kind);
    s->line = line;
    return s;
  }

  StmtPtr parse_statement() {
    Token name = next();
    const std::string& n = name.text;
    if (n == "if") return parse_if(name.line);
    if (n == "for") return parse_for(name.line);
    if (n == "set") return parse_set(name.line);
    if (n == "macro") return parse_macro(name.line);
    if (n == "call") return parse_call_block(name.line);
    if (n == "filter") return parse_filter_block(name.line);
    if (n == "break" || n == "continue") {
      expect_block_end();
      return make_stmt(n == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, name.line);
    }
    if (n == "generation") {
      expect_block_end();
      auto s = make_stmt(Stmt::Kind::Scope, name.line);
      s->body = subparse({"endgeneration"});
      end_tag();
      return s;
    }
    syntax_error(name.line, fmt::format("encountered unknown tag '{}'", n));
  }

  // Consumes `endxxx %}` after subparse stopped on it.
  void end_tag() {
    ++pos_;
    expect_block_end();
  }

  StmtPtr parse_if(int line) {
    auto s = make_stmt(Stmt::Kind::If, line);
    ExprPtr cond = parse_tuple(false, {});
    expect_block_end();
    while (true) {
      Body body = subparse({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(cond), std::move(body));
      std::string which = next().text;
      if (which == "elif") {
        cond = parse_tuple(false, {});
        expect_block_end();
      } else if (which == "else") {
        expect_block_end();
        Body else_body = subparse({"endif"});
        s->branches.emplace_back(nullptr, std::move(else_body));
        end_tag();
        return s;
      } else {
        expect_block_end();
        return s;
      }
    }
  }

  Target parse_target(bool allow_attr) {
    Target t;
    int line = cur().line;
    std::string first = expect_name();
    if (allow_attr && is_op(".")) {
      ++pos_;
      t.names.push_back(first);
      t.attr = expect_name();
      return t;
    }
    t.names.push_back(first);
    while (skip_op(",")) {
      t.is_tuple = true;
      if (cur().type != Tok::Name) break;
      t.names.push_back(expect_name());
    }
    for (const auto& n : t.names) {
      if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None") {
        syntax_error(line, fmt::format("can't assign to '{}'", n));
      }
    }
    return t;
  }

  StmtPtr parse_for(int line) {
    auto s = make_stmt(Stmt::Kind::For, line);
    bool paren = skip_op("(");
    s->target = parse_target(false);
    if (paren) expect_op(")");
    if (!skip_name("in")) syntax_error(cur().line, "expected 'in' in for loop");
    s->expr = parse_tuple(false, {"recursive"}, false);
    if (skip_name("if")) s->filter = parse_expression(true);
    if (is_name("recursive")) syntax_error(cur().line, "recursive for loops are not supported");
    expect_block_end();
    s->body = subparse({"endfor", "else"});
    if (next().text == "else") {
      expect_block_end();
      s->else_body = subparse({"endfor"});
      end_tag();
    } else {
      expect_block_end();
    }
    return s;
  }

  StmtPtr parse_set(int line) {
    Target target = parse_target(true);
    if (skip_op("=")) {
      auto s = make_stmt(Stmt::Kind::Set, line);
      s->target = std::move(target);
      s->expr = parse_tuple(true, {});
      expect_block_end();
      return s;
    }
    if (target.is_tuple || !target.attr.empty()) syntax_error(line, "block set needs a single name");
    auto s = make_stmt(Stmt::Kind::SetBlock, line);
    s->target = std::move(target);
    while (is_op("|")) s->filter = parse_filter_chain(std::move(s->filter));
    expect_block_end();
    s->body = subparse({"endset"});
    end_tag();
    return s;
  }

  std::vector<MacroParam> parse_signature() {
    std::vector<MacroParam> params;
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      MacroParam p;
      p.name = expect_name();
      if (skip_op("=")) {
        p.default_value = parse_expression(true);
      } else if (!params.empty() && params.back().default_value) {
        syntax_error(cur().line, "non-default argument follows default argument");
      }
      params.push_back(std::move(p));
    }
    expect_op(")");
    return params;
  }

  StmtPtr parse_macro(int line) {
    auto s = make_stmt(Stmt::Kind::Macro, line);
    s->text = expect_name();
    s->params = parse_signature();
    expect_block_end();
    s->body = subparse({"endmacro"});
    end_tag();
    return s;
  }

  StmtPtr parse_call_block(int line) {
    auto s = make_stmt(Stmt::Kind::CallBlock, line);
    if (is_op("(")) s->params = parse_signature();
    s->expr = parse_expression(true);
    if (s->expr->kind != Expr::Kind::Call) syntax_error(line, "expected a call after 'call'");
    expect_block_end();
    s->body = subparse({"endcall"});
    end_tag();
    return s;
  }

  StmtPtr parse_filter_block(int line) {
    auto s = make_stmt(Stmt::Kind::FilterBlock, line);
    s->filter = parse_filter_chain(nullptr, /*leading_bar=*/false);
    expect_block_end();
    s->body = subparse({"endfilter"});
    end_tag();
    return s;
  }

  // ---- expressions

  ExprPtr make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // A comma-separated expression list; more than one element (or a trailing
  // comma) makes a tuple.
  ExprPtr parse_tuple(bool with_condexpr, const std::vector<std::string>& extra_ends,
                      bool explicit_parens = false) {
    int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        is_tuple = true;
      }
      if (tuple_ends(extra_ends)) break;
      items.push_back(parse_expression(with_condexpr));
    }
    if (!is_tuple) {
      if (items.empty()) {
        if (!explicit_parens) syntax_error(line, fmt::format("expected an expression, got '{}'", describe(cur())));
      } else {
        return std::move(items[0]);
      }
    }
    auto e = make(Expr::Kind::TupleLit, line);
    e->items = std::move(items);
    return e;
  }

  bool tuple_ends(const std::vector<std::string>& extra_ends) const {
    const Token& t = cur();
    if (t.type == Tok::VarEnd || t.type == Tok::BlockEnd || t.type == Tok::Eof) return true;
    if (t.type == Tok::Op && t.text == ")") return true;
    if (t.type == Tok::Name) {
      for (const auto& e : extra_ends) {
        if (t.text == e) return true;
      }
    }
    return false;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    if (!with_condexpr) return parse_or();
    int line = cur().line;
    ExprPtr expr = parse_or();
    while (skip_name("if")) {
      auto e = make(Expr::Kind::CondExpr, line);
      e->b = parse_or();  // condition
      if (skip_name("else")) e->c = parse_expression(true);
      e->a = std::move(expr);
      expr = std::move(e);
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      int line = next().line;
      auto e = make(Expr::Kind::Or, line);
      e->a = std::move(left);
      e->b = parse_and();
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      int line = next().line;
      auto e = make(Expr::Kind::And, line);
      e->a = std::move(left);
      e->b = parse_not();
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      int line = next().line;
      auto e = make(Expr::Kind::Not, line);
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> rest;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
           cur().text == "<=" || cur().text == ">=")) {
        op = next().text;
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        pos_ += 2;
        op = "notin";
      } else {
        break;
      }
      ops.push_back(op);
      rest.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = make(Expr::Kind::Compare, line);
    e->a = std::move(first);
    e->ops = std::move(ops);
    e->items = std::move(rest);
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, int line) {
    auto e = make(Expr::Kind::Binary, line);
    e->name = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      Token op = next();
      left = binary(op.text, std::move(left), parse_concat(), op.line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      Token op = next();
      left = binary("~", std::move(left), parse_math2(), op.line);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      Token op = next();
      left = binary(op.text, std::move(left), parse_pow(), op.line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      Token op = next();
      left = binary("**", std::move(left), parse_unary(true), op.line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    int line = cur().line;
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      bool neg = next().text == "-";
      node = make(neg ? Expr::Kind::Neg : Expr::Kind::Pos, line);
      node->a = parse_unary(false);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    if (t.type == Tok::Name) {
      std::string n = next().text;
      auto e = make(Expr::Kind::Const, line);
      if (n == "true" || n == "True") {
        e->value = Value::boolean(true);
      } else if (n == "false" || n == "False") {
        e->value = Value::boolean(false);
      } else if (n == "none" || n == "None") {
        e->value = Value::none();
      } else {
        e->kind = Expr::Kind::Name;
        e->name = n;
      }
      return e;
    }
    if (t.type == Tok::String) {
      std::string s = next().text;
      while (cur().type == Tok::String) s += next().text;
      auto e = make(Expr::Kind::Const, line);
      e->value = Value::string(std::move(s));
      return e;
    }
    if (t.type == Tok::Int || t.type == Tok::Float) {
      Token num = next();
      auto e = make(Expr::Kind::Const, line);
      e->value = num.type == Tok::Int ? Value::integer(num.int_value) : Value::number(num.float_value);
      return e;
    }
    if (is_op("(")) {
      ++pos_;
      ExprPtr e = parse_tuple(true, {}, true);
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++pos_;
      auto e = make(Expr::Kind::ListLit, line);
      while (!is_op("]")) {
        if (!e->items.empty()) expect_op(",");
        if (is_op("]")) break;
        e->items.push_back(parse_expression(true));
      }
      expect_op("]");
      return e;
    }
    if (is_op("{")) {
      ++pos_;
      auto e = make(Expr::Kind::DictLit, line);
      while (!is_op("}")) {
        if (!e->items.empty()) expect_op(",");
        if (is_op("}")) break;
        e->items.push_back(parse_expression(true));
        expect_op(":");
        e->items.push_back(parse_expression(true));
      }
      expect_op("}");
      return e;
    }
    syntax_error(line, fmt::format("unexpected '{}'", describe(t)));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter_chain(std::move(node));
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    DepthGuard guard(*this);
    Token t = next();
    if (t.text == ".") {
      if (cur().type == Tok::Name) {
        auto e = make(Expr::Kind::GetAttr, t.line);
        e->name = next().text;
        e->a = std::move(node);
        return e;
      }
      if (cur().type == Tok::Int) {
        auto e = make(Expr::Kind::GetItem, t.line);
        auto idx = make(Expr::Kind::Const, t.line);
        idx->value = Value::integer(next().int_value);
        e->a = std::move(node);
        e->b = std::move(idx);
        return e;
      }
      syntax_error(t.line, "expected a name or number after '.'");
    }
    // '[': index or slice
    ExprPtr parts[3];
    int part = 0;
    bool is_slice = false;
    while (!is_op("]")) {
      if (is_op(":")) {
        ++pos_;
        is_slice = true;
        if (++part > 2) syntax_error(t.line, "too many ':' in slice");
        continue;
      }
      if (parts[part]) syntax_error(t.line, "expected ']' or ':' in subscript");
      parts[part] = parse_expression(true);
      if (!is_slice && is_op(",")) syntax_error(t.line, "tuple subscripts are not supported");
    }
    expect_op("]");
    if (!is_slice) {
      if (!parts[0]) syntax_error(t.line, "empty subscript");
      auto e = make(Expr::Kind::GetItem, t.line);
      e->a = std::move(node);
      e->b = std::move(parts[0]);
      return e;
    }
    auto e = make(Expr::Kind::Slice, t.line);
    e->items.push_back(std::move(node));
    for (auto& p : parts) e->items.push_back(std::move(p));
    return e;
  }

  Arguments parse_args() {
    DepthGuard guard(*this);
    Arguments args;
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) syntax_error(cur().line, "*args and **kwargs in calls are not supported");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string key = next().text;
        ++pos_;
        args.keyword.emplace_back(key, parse_expression(true));
      } else {
        if (!args.keyword.empty()) syntax_error(cur().line, "positional argument follows keyword argument");
        args.positional.push_back(parse_expression(true));
      }
    }
    expect_op(")");
    return args;
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(Expr::Kind::Call, cur().line);
    e->args = parse_args();
    e->a = std::move(node);
    return e;
  }

  std::string dotted_name() {
    std::string n = expect_name();
    while (is_op(".") && peek().type == Tok::Name) {
      ++pos_;
      n += '.';
      n += next().text;
    }
    return n;
  }

  // `| f1(args) | f2 ...`; with node == null the chain applies to a
  // placeholder (filter blocks, `{% set x | f %}`).
  ExprPtr parse_filter_chain(ExprPtr node, bool leading_bar = true) {
    bool first = true;
    while (true) {
      if (first && !leading_bar) {
        // filter block: the first filter has no bar
      } else if (!skip_op("|")) {
        return node;
      }
      first = false;
      DepthGuard guard(*this);
      auto e = make(Expr::Kind::Filter, cur().line);
      e->name = dotted_name();
      if (is_op("(")) e->args = parse_args();
      e->a = std::move(node);
      node = std::move(e);
      if (leading_bar) return node;  // parse_filter_expr loops for the next '|'
    }
  }

  ExprPtr parse_test(ExprPtr node) {
    DepthGuard guard(*this);
    int line = next().line;  // 'is'
    auto e = make(Expr::Kind::Test, line);
    e->negated = skip_name("not");
    e->name = dotted_name();
    const Token& t = cur();
    if (is_op("(")) {
      e->args = parse_args();
    } else if ((t.type == Tok::Name || t.type == Tok::String || t.type == Tok::Int || t.type == Tok::Float ||
                (t.type == Tok::Op && (t.text == "(" || t.text == "[" || t.text == "{"))) &&
               !(t.type == Tok::Name && (t.text == "else" || t.text == "or" || t.text == "and"))) {
      if (is_name("is")) syntax_error(t.line, "you cannot chain multiple tests with is");
      e->args.positional.push_back(parse_postfix(parse_primary()));
    }
    e->a = std::move(node);
    return e;
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Expr::~Expr() {
  std::vector<ExprPtr> pending;
  auto take = [&pending](Expr& e) {
    if (e.a) pending.push_back(std::move(e.a));
    if (e.b) pending.push_back(std::move(e.b));
    if (e.c) pending.push_back(std::move(e.c));
    for (auto& i : e.items) {
      if (i) pending.push_back(std::move(i));
    }
    for (auto& i : e.args.positional) pending.push_back(std::move(i));
    for (auto& kv : e.args.keyword) pending.push_back(std::move(kv.second));
  };
  take(*this);
  while (!pending.empty()) {
    ExprPtr e = std::move(pending.back());
    pending.pop_back();
    if (e) take(*e);
  }
}

std::shared_ptr<const TemplateData> parse_template(std::string_view source) {
  auto data = std::make_shared<TemplateData>();
  Parser parser(Lexer(source).run());
  data->body = parser.parse_all();
  return data;
}

}  // namespace basalt::jinja

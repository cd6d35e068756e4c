// Syntax tree of a parsed Jinja template (internal to src/template).
//
// Contract: parse_template() turns source text into a TemplateData whose
// nodes carry the 1-based source line they start on; the tree is immutable
// after parsing and shared by all renders. Syntax errors throw basalt::Error
// "jinja template line N: ...". Nesting deeper than kMaxParseDepth is a
// syntax error, so neither parsing nor evaluation can overflow the stack.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "template/value.h"

namespace basalt::jinja {

inline constexpr int kMaxParseDepth = 200;

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct Expr {
  Expr() = default;
  Expr(const Expr&) = delete;
  Expr& operator=(const Expr&) = delete;
  // Frees children iteratively: a long operator or subscript chain must not
  // recurse once per node.
  ~Expr();
  enum class Kind {
    Const,      // value
    Name,       // name
    GetAttr,    // a.name
    GetItem,    // a[b]
    Slice,      // a[b:c:d] (null parts omitted)
    Call,       // a(args)
    Filter,     // a | name(args)
    Test,       // a is [not] name(args)
    Neg,        // -a
    Pos,        // +a
    Not,        // not a
    Binary,     // a op b  (+ - * / // % ** ~)
    And,
    Or,
    Compare,    // a op b op c ...
    CondExpr,   // a if b else c
    ListLit,
    TupleLit,
    DictLit,
  };
  Kind kind;
  int line = 0;
  Value value;            // Const
  std::string name;       // Name, GetAttr, Filter, Test, Binary op
  ExprPtr a, b, c;        // operands
  std::vector<ExprPtr> items;                    // List/Tuple literal; dict: key, value, key, ...
  std::vector<std::string> ops;                  // Compare operators
  Arguments args;                                // Call, Filter, Test
  bool negated = false;                          // Test
};

// An assignment target: a name, `ns.attr`, or a tuple of names.
struct Target {
  std::vector<std::string> names;  // one name, or the tuple's names
  bool is_tuple = false;
  std::string attr;                // set for ns.attr (names[0] is the namespace)
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt {
  enum class Kind { Text, Output, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, Break, Continue, Scope };
  explicit Stmt(Kind k) : kind(k) {}
  Kind kind;
  int line = 0;
  std::string text;                     // Text; Macro name
  ExprPtr expr;                         // Output, Set value, For iterable, CallBlock call
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: (condition or null for else, body)
  Target target;                        // For, Set, SetBlock
  ExprPtr filter;                       // For: `if` condition; FilterBlock: filter chain applied to a placeholder
  Body body;                            // For, SetBlock, Macro, CallBlock, FilterBlock, Scope
  Body else_body;                       // For
  std::vector<MacroParam> params;       // Macro, CallBlock (caller's params)
};

struct TemplateData {
  Body body;
  std::string source;  // kept for nothing but lifetime clarity of names
};

std::shared_ptr<const TemplateData> parse_template(std::string_view source);

}  // namespace basalt::jinja

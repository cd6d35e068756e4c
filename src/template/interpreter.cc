#include "template/interpreter.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"

namespace basalt::jinja {

namespace {

// An error that already names its template line; outer frames pass it on.
class LocatedError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void undefined_error(const Value& v) {
  const std::string& hint = v.undefined_hint();
  fail("{}", hint.empty() ? std::string("value is undefined") : hint);
}

bool checked_add(int64_t a, int64_t b, int64_t& r) { return !__builtin_add_overflow(a, b, &r); }
bool checked_sub(int64_t a, int64_t b, int64_t& r) { return !__builtin_sub_overflow(a, b, &r); }
bool checked_mul(int64_t a, int64_t b, int64_t& r) { return !__builtin_mul_overflow(a, b, &r); }

int64_t floor_div(int64_t a, int64_t b) {
  if (a == INT64_MIN && b == -1) fail("integer overflow");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t py_mod(int64_t a, int64_t b) {
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

double py_fmod(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  if (r == 0) r = std::copysign(0.0, b);
  return r;
}

}  // namespace

// ---------------------------------------------------------------- CallArgs

Value CallArgs::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return v;
  }
  return Value();
}

bool CallArgs::has(size_t index, std::string_view name) const {
  if (index < positional.size()) return true;
  for (const auto& kv : keyword) {
    if (kv.first == name) return true;
  }
  return false;
}

void CallArgs::check(std::string_view function, size_t max_positional,
                     std::initializer_list<std::string_view> keywords) const {
  BASALT_CHECK(positional.size() <= max_positional, "{}() takes at most {} positional argument(s) ({} given)",
               function, max_positional, positional.size());
  for (const auto& kv : keyword) {
    bool known = false;
    for (auto k : keywords) known = known || k == kv.first;
    BASALT_CHECK(known, "{}() got an unexpected keyword argument '{}'", function, kv.first);
  }
}

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

// ---------------------------------------------------------------- Interpreter

Interpreter::DepthGuard::DepthGuard(Interpreter& in) : in(in) {
  if (++in.depth_ > in.options_.max_depth) {
    --in.depth_;
    fail("template nesting or recursion deeper than {} levels", in.options_.max_depth);
  }
}

Interpreter::Interpreter(std::shared_ptr<const TemplateData> data, const RenderOptions& options)
    : data_(std::move(data)), options_(options), globals_(std::make_shared<Scope>()) {
  install_globals(*globals_);
}

Interpreter::~Interpreter() {
  for (auto& ns : namespaces_) ns.namespace_data().attrs.clear();
}

void Interpreter::check_string_size(size_t bytes) const {
  BASALT_CHECK(bytes <= options_.max_output_bytes, "string of {} bytes exceeds the limit of {} bytes", bytes,
               options_.max_output_bytes);
}

void Interpreter::check_list_size(size_t items) const {
  BASALT_CHECK(items <= options_.max_list_items, "sequence of {} items exceeds the limit of {} items", items,
               options_.max_list_items);
}

void Interpreter::step() {
  BASALT_CHECK(++steps_ <= options_.max_steps, "template exceeded the limit of {} evaluation steps",
               options_.max_steps);
}

void Interpreter::append(std::string& out, std::string_view text) const {
  BASALT_CHECK(out.size() + text.size() <= options_.max_output_bytes,
               "template output exceeds the limit of {} bytes", options_.max_output_bytes);
  out.append(text);
}

std::string Interpreter::render(const Value& context) {
  auto root = std::make_shared<Scope>();
  root->parent = globals_;
  if (context.is_dict()) {
    for (const auto& [k, v] : context.dict_data().items) root->vars[k.str()] = v;
  }
  std::string out;
  exec_body(data_->body, root, out);
  return out;
}

Interpreter::Flow Interpreter::exec_body(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const auto& s : body) {
    Flow f = exec(*s, scope, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, const ScopePtr& scope, std::string& out) {
  try {
    DepthGuard guard(*this);
    return exec_inner(s, scope, out);
  } catch (const LocatedError&) {
    throw;
  } catch (const Error& e) {
    throw LocatedError(fmt::format("jinja template line {}: {}", s.line, e.what()));
  }
}

Interpreter::Flow Interpreter::exec_inner(const Stmt& s, const ScopePtr& scope, std::string& out) {
  switch (s.kind) {
    case Stmt::Kind::Text: append(out, s.text); return Flow::Normal;
    case Stmt::Kind::Output: {
      Value v = eval(*s.expr, scope);
      append(out, v.str());
      return Flow::Normal;
    }
    case Stmt::Kind::If:
      for (const auto& [cond, body] : s.branches) {
        if (!cond || eval(*cond, scope).truthy()) return exec_body(body, scope, out);
      }
      return Flow::Normal;
    case Stmt::Kind::For: return exec_for(s, scope, out);
    case Stmt::Kind::Set: assign(s.target, eval(*s.expr, scope), scope, s.line); return Flow::Normal;
    case Stmt::Kind::SetBlock: {
      std::string text;
      Flow f = exec_body(s.body, scope, text);
      Value v = Value::string(std::move(text));
      if (s.filter) {
        filter_inputs_.push_back(v);
        try {
          v = eval(*s.filter, scope);
        } catch (...) {
          filter_inputs_.pop_back();
          throw;
        }
        filter_inputs_.pop_back();
      }
      assign(s.target, v, scope, s.line);
      return f;
    }
    case Stmt::Kind::FilterBlock: {
      std::string text;
      Flow f = exec_body(s.body, scope, text);
      filter_inputs_.push_back(Value::string(std::move(text)));
      Value v;
      try {
        v = eval(*s.filter, scope);
      } catch (...) {
        filter_inputs_.pop_back();
        throw;
      }
      filter_inputs_.pop_back();
      append(out, v.str());
      return f;
    }
    case Stmt::Kind::Macro: scope->vars[s.text] = make_macro(s, scope); return Flow::Normal;
    case Stmt::Kind::CallBlock: {
      const Expr& call_expr = *s.expr;
      Value callee = eval(*call_expr.a, scope);
      CallArgs args = eval_args(call_expr.args, scope);
      // The caller is a macro over the call block's body.
      args.keyword.emplace_back("caller", make_macro(s, scope));
      append(out, call(callee, args).str());
      return Flow::Normal;
    }
    case Stmt::Kind::Break: return Flow::Break;
    case Stmt::Kind::Continue: return Flow::Continue;
    case Stmt::Kind::Scope: {
      // transformers renders {% generation %} as a call block: its own scope.
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      exec_body(s.body, inner, out);
      return Flow::Normal;
    }
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
  Value iterable = eval(*s.expr, scope);
  ValueList items = iterate(iterable);
  if (s.filter) {
    ValueList kept;
    for (const auto& item : items) {
      step();
      auto tmp = std::make_shared<Scope>();
      tmp->parent = scope;
      assign(s.target, item, tmp, s.line);
      if (eval(*s.filter, tmp).truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec_body(s.else_body, scope, out);
  auto shared_items = std::make_shared<ValueList>(std::move(items));
  const auto n = static_cast<int64_t>(shared_items->size());
  for (int64_t i = 0; i < n; ++i) {
    step();
    auto iter_scope = std::make_shared<Scope>();
    iter_scope->parent = scope;
    const Value& item = (*shared_items)[static_cast<size_t>(i)];
    assign(s.target, item, iter_scope, s.line);
    ValuePairs loop;
    loop.reserve(12);
    loop.emplace_back(Value::string("index"), Value::integer(i + 1));
    loop.emplace_back(Value::string("index0"), Value::integer(i));
    loop.emplace_back(Value::string("revindex"), Value::integer(n - i));
    loop.emplace_back(Value::string("revindex0"), Value::integer(n - i - 1));
    loop.emplace_back(Value::string("first"), Value::boolean(i == 0));
    loop.emplace_back(Value::string("last"), Value::boolean(i == n - 1));
    loop.emplace_back(Value::string("length"), Value::integer(n));
    loop.emplace_back(Value::string("depth"), Value::integer(1));
    loop.emplace_back(Value::string("depth0"), Value::integer(0));
    if (i > 0) loop.emplace_back(Value::string("previtem"), (*shared_items)[static_cast<size_t>(i - 1)]);
    if (i + 1 < n) loop.emplace_back(Value::string("nextitem"), (*shared_items)[static_cast<size_t>(i + 1)]);
    loop.emplace_back(Value::string("cycle"), Value::callable("loop.cycle", [i](CallArgs& args, Interpreter&) {
                        BASALT_CHECK(!args.positional.empty(), "no items for cycling given");
                        return args.positional[static_cast<size_t>(i) % args.positional.size()];
                      }));
    iter_scope->vars["loop"] = Value::dict(std::move(loop));
    Flow f = exec_body(s.body, iter_scope, out);
    if (f == Flow::Break) break;
  }
  return Flow::Normal;
}

void Interpreter::assign(const Target& t, const Value& v, const ScopePtr& scope, int line) {
  if (!t.attr.empty()) {
    const Value* ns = scope->find(t.names[0]);
    BASALT_CHECK(ns && ns->is_namespace(), "cannot assign attribute '{}' on non-namespace object '{}'", t.attr,
                 t.names[0]);
    auto& attrs = ns->namespace_data().attrs;
    for (auto& [k, val] : attrs) {
      if (k.as_string() == t.attr) {
        val = v;
        return;
      }
    }
    attrs.emplace_back(Value::string(t.attr), v);
    return;
  }
  if (!t.is_tuple) {
    scope->vars[t.names[0]] = v;
    return;
  }
  ValueList parts = (v.is_list()) ? v.items() : iterate(v);
  BASALT_CHECK(!v.is_undefined(), "cannot unpack an undefined value");
  BASALT_CHECK(parts.size() >= t.names.size(), "not enough values to unpack (expected {}, got {})", t.names.size(),
               parts.size());
  BASALT_CHECK(parts.size() <= t.names.size(), "too many values to unpack (expected {})", t.names.size());
  for (size_t i = 0; i < t.names.size(); ++i) scope->vars[t.names[i]] = parts[i];
}

Value Interpreter::make_macro(const Stmt& s, const ScopePtr& scope) {
  const Stmt* stmt = &s;
  // Weak: the scope holds the macro, so a strong reference would be a cycle.
  std::weak_ptr<Scope> closure = scope;
  std::string name = s.kind == Stmt::Kind::Macro ? s.text : "caller";
  return Value::callable(name, [stmt, closure, name](CallArgs& args, Interpreter& in) -> Value {
    auto local = std::make_shared<Scope>();
    local->parent = closure.lock();
    BASALT_CHECK(local->parent, "macro '{}' called after the scope that defined it ended", name);
    const auto& params = stmt->params;
    BASALT_CHECK(args.positional.size() <= params.size(), "macro '{}' takes not more than {} argument(s)", name,
                 params.size());
    for (const auto& [k, v] : args.keyword) {
      bool known = k == "caller";
      for (const auto& p : params) known = known || p.name == k;
      BASALT_CHECK(known, "macro '{}' takes no keyword argument '{}'", name, k);
      if (k == "caller") local->vars["caller"] = v;
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& p = params[i];
      bool from_kw = false;
      for (const auto& [k, v] : args.keyword) {
        if (k == p.name) {
          BASALT_CHECK(i >= args.positional.size(), "macro '{}' got multiple values for argument '{}'", name,
                       p.name);
          local->vars[p.name] = v;
          from_kw = true;
        }
      }
      if (from_kw) continue;
      if (i < args.positional.size()) {
        local->vars[p.name] = args.positional[i];
      } else if (p.default_value) {
        local->vars[p.name] = in.eval(*p.default_value, local);
      } else {
        local->vars[p.name] = Value::undefined(fmt::format("parameter '{}' was not provided", p.name));
      }
    }
    std::string out;
    in.exec_body(stmt->body, local, out);
    return Value::string(std::move(out));
  });
}

// ---------------------------------------------------------------- expressions

Value Interpreter::eval(const Expr& e, const ScopePtr& scope) {
  try {
    DepthGuard guard(*this);
    step();
    return eval_inner(e, scope);
  } catch (const LocatedError&) {
    throw;
  } catch (const Error& err) {
    throw LocatedError(fmt::format("jinja template line {}: {}", e.line, err.what()));
  }
}

CallArgs Interpreter::eval_args(const Arguments& args, const ScopePtr& scope) {
  CallArgs out;
  for (const auto& p : args.positional) out.positional.push_back(eval(*p, scope));
  for (const auto& [k, v] : args.keyword) out.keyword.emplace_back(k, eval(*v, scope));
  return out;
}

Value Interpreter::eval_inner(const Expr& e, const ScopePtr& scope) {
  switch (e.kind) {
    case Expr::Kind::Const: return e.value;
    case Expr::Kind::Name: {
      const Value* v = scope->find(e.name);
      if (v) return *v;
      return Value::undefined(fmt::format("'{}' is undefined", e.name));
    }
    case Expr::Kind::GetAttr: return getattr(eval(*e.a, scope), e.name);
    case Expr::Kind::GetItem: return getitem(eval(*e.a, scope), eval(*e.b, scope));
    case Expr::Kind::Slice: {
      Value obj = eval(*e.items[0], scope);
      if (obj.is_undefined()) undefined_error(obj);
      Value parts[3];
      for (int i = 0; i < 3; ++i) {
        if (e.items[static_cast<size_t>(i) + 1]) parts[i] = eval(*e.items[static_cast<size_t>(i) + 1], scope);
      }
      for (auto& p : parts) {
        BASALT_CHECK(p.is_undefined() || p.is_none() || p.is_int() || p.is_bool(),
                     "slice indices must be integers or None");
      }
      int64_t step_v = parts[2].is_int() || parts[2].is_bool() ? parts[2].as_int() : 1;
      BASALT_CHECK(step_v != 0, "slice step cannot be zero");
      auto slice_indices = [&](int64_t len) {
        std::vector<int64_t> idx;
        auto adjust = [&](const Value& v, int64_t def) -> int64_t {
          if (!(v.is_int() || v.is_bool())) return def;
          int64_t x = v.as_int();
          if (x < 0) {
            x += len;
            if (x < 0) x = step_v < 0 ? -1 : 0;
          } else if (x >= len) {
            x = step_v < 0 ? len - 1 : len;
          }
          return x;
        };
        int64_t start = adjust(parts[0], step_v < 0 ? len - 1 : 0);
        int64_t stop = adjust(parts[1], step_v < 0 ? -1 : len);
        if (step_v > 0) {
          for (int64_t i = start; i < stop; i += step_v) idx.push_back(i);
        } else {
          for (int64_t i = start; i > stop; i += step_v) idx.push_back(i);
        }
        return idx;
      };
      if (obj.is_string()) {
        auto cps = utf8_decode(obj.as_string());
        std::u32string out;
        for (int64_t i : slice_indices(static_cast<int64_t>(cps.size()))) out += cps[static_cast<size_t>(i)];
        return Value::string(utf8_encode(out));
      }
      if (obj.is_list()) {
        ValueList out;
        for (int64_t i : slice_indices(static_cast<int64_t>(obj.items().size()))) {
          out.push_back(obj.items()[static_cast<size_t>(i)]);
        }
        return Value::list(std::move(out), obj.is_tuple());
      }
      fail("'{}' object is not subscriptable", obj.type_name());
    }
    case Expr::Kind::Call: {
      Value callee = eval(*e.a, scope);
      CallArgs args = eval_args(e.args, scope);
      return call(callee, args);
    }
    case Expr::Kind::Filter: {
      Value input;
      if (e.a) {
        input = eval(*e.a, scope);
      } else {
        BASALT_ASSERT(!filter_inputs_.empty());
        input = filter_inputs_.back();
      }
      CallArgs args = eval_args(e.args, scope);
      return apply_filter(e.name, input, args);
    }
    case Expr::Kind::Test: {
      Value input = eval(*e.a, scope);
      CallArgs args = eval_args(e.args, scope);
      bool r = apply_test(e.name, input, args);
      return Value::boolean(e.negated ? !r : r);
    }
    case Expr::Kind::Neg:
    case Expr::Kind::Pos: {
      Value v = eval(*e.a, scope);
      if (v.is_undefined()) undefined_error(v);
      BASALT_CHECK(v.is_number(), "bad operand type for unary {}: '{}'", e.kind == Expr::Kind::Neg ? '-' : '+',
                   v.type_name());
      if (e.kind == Expr::Kind::Pos) return v.is_bool() ? Value::integer(v.as_int()) : v;
      if (v.is_float()) return Value::number(-v.as_double());
      BASALT_CHECK(v.as_int() != INT64_MIN, "integer overflow");
      return Value::integer(-v.as_int());
    }
    case Expr::Kind::Not: return Value::boolean(!eval(*e.a, scope).truthy());
    case Expr::Kind::And: {
      Value l = eval(*e.a, scope);
      if (!l.truthy()) return l;
      return eval(*e.b, scope);
    }
    case Expr::Kind::Or: {
      Value l = eval(*e.a, scope);
      if (l.truthy()) return l;
      return eval(*e.b, scope);
    }
    case Expr::Kind::Binary: {
      Value l = eval(*e.a, scope);
      Value r = eval(*e.b, scope);
      return binary(e.name, l, r);
    }
    case Expr::Kind::Compare: {
      Value left = eval(*e.a, scope);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.items[i], scope);
        if (!compare_op(e.ops[i], left, right)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case Expr::Kind::CondExpr: {
      if (eval(*e.b, scope).truthy()) return eval(*e.a, scope);
      if (e.c) return eval(*e.c, scope);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
    }
    case Expr::Kind::ListLit:
    case Expr::Kind::TupleLit: {
      ValueList items;
      for (const auto& item : e.items) items.push_back(eval(*item, scope));
      return Value::list(std::move(items), e.kind == Expr::Kind::TupleLit);
    }
    case Expr::Kind::DictLit: {
      auto d = std::make_shared<DictData>();
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        Value k = eval(*e.items[i], scope);
        BASALT_CHECK(k.is_string() || k.is_number() || k.is_none() || (k.is_list() && k.is_tuple()),
                     "unhashable type: '{}'", k.type_name());
        d->set(std::move(k), eval(*e.items[i + 1], scope));
      }
      return Value::dict(std::move(d));
    }
  }
  return Value();
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) undefined_error(callee);
  BASALT_CHECK(callee.is_callable(), "'{}' object is not callable", callee.type_name());
  DepthGuard guard(*this);
  return callee.callable_data().fn(args, *this);
}

Value Interpreter::apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  FilterFn fn = find_filter(name);
  BASALT_CHECK(fn, "no filter named '{}'", name);
  return fn(*this, input, args);
}

bool Interpreter::apply_test(const std::string& name, const Value& input, CallArgs& args) {
  TestFn fn = find_test(name);
  BASALT_CHECK(fn, "no test named '{}'", name);
  return fn(*this, input, args);
}

ValueList Interpreter::iterate(const Value& v) const {
  switch (v.kind()) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return v.items();
    case Value::Kind::Dict: {
      ValueList keys;
      keys.reserve(v.dict_data().items.size());
      for (const auto& kv : v.dict_data().items) keys.push_back(kv.first);
      return keys;
    }
    case Value::Kind::String: {
      ValueList chars;
      for (char32_t c : utf8_decode(v.as_string())) {
        std::string s;
        utf8_append(s, c);
        chars.push_back(Value::string(std::move(s)));
      }
      return chars;
    }
    default: fail("'{}' object is not iterable", v.type_name());
  }
}

Value Interpreter::getattr(const Value& obj, const std::string& name) const {
  if (obj.is_undefined()) undefined_error(obj);
  if (!name.empty() && name[0] == '_') {
    return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe", name, obj.type_name()));
  }
  if (obj.is_namespace()) {
    for (const auto& [k, v] : obj.namespace_data().attrs) {
      if (k.as_string() == name) return v;
    }
    return Value::undefined(fmt::format("'Namespace' object has no attribute '{}'", name));
  }
  Value method = find_method(obj, name);
  if (!method.is_undefined()) return method;
  if (obj.is_dict()) {
    auto at = obj.dict_data().find(std::string_view(name));
    if (at >= 0) return obj.dict_data().items[static_cast<size_t>(at)].second;
  }
  if (obj.is_none()) return Value::undefined(fmt::format("'None' has no attribute '{}'", name));
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", obj.type_name(), name));
}

Value Interpreter::getitem(const Value& obj, const Value& key) const {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_dict()) {
    auto at = obj.dict_data().find(key);
    if (at >= 0) return obj.dict_data().items[static_cast<size_t>(at)].second;
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      auto n = static_cast<int64_t>(obj.items().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.items()[static_cast<size_t>(i)];
    } else {
      auto cps = utf8_decode(obj.as_string());
      auto n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value::string(utf8_encode(std::u32string(1, cps[static_cast<size_t>(i)])));
    }
  }
  if (key.is_string()) return getattr(obj, key.as_string());
  if (obj.is_none()) return Value::undefined(fmt::format("'None' has no attribute {}", key.repr()));
  return Value::undefined(fmt::format("'{} object' has no attribute {}", obj.type_name(), key.repr()));
}

Value Interpreter::get_attribute_path(const Value& obj, const Value& path) const {
  if (path.is_int()) return getitem(obj, path);
  std::string p = path.str();
  Value cur = obj;
  size_t start = 0;
  while (true) {
    size_t dot = p.find('.', start);
    std::string part = p.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    if (digits && part.size() < 18) {
      cur = getitem(cur, Value::integer(std::stoll(part)));
    } else {
      cur = getitem(cur, Value::string(part));
    }
    if (dot == std::string::npos) return cur;
    if (cur.is_undefined()) return cur;
    start = dot + 1;
  }
}

bool Interpreter::compare_op(const std::string& op, const Value& a, const Value& b) const {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in" || op == "notin") {
    bool found = false;
    if (b.is_string()) {
      if (a.is_undefined()) undefined_error(a);
      BASALT_CHECK(a.is_string(), "'in <string>' requires string as left operand, not {}", a.type_name());
      found = b.as_string().find(a.as_string()) != std::string::npos;
    } else if (b.is_list()) {
      for (const auto& item : b.items()) {
        if (equals(a, item)) {
          found = true;
          break;
        }
      }
    } else if (b.is_dict()) {
      found = b.dict_data().find(a) >= 0;
    } else if (b.is_undefined()) {
      found = false;
    } else {
      fail("argument of type '{}' is not iterable", b.type_name());
    }
    return op == "in" ? found : !found;
  }
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  int c = 0;
  try {
    c = compare(a, b);
  } catch (const Error&) {
    fail("'{}' not supported between instances of '{}' and '{}'", op, a.type_name(), b.type_name());
  }
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  return c >= 0;
}

Value Interpreter::binary(const std::string& op, const Value& a, const Value& b) const {
  if (op == "~") {
    std::string s = a.str();
    std::string t = b.str();
    check_string_size(s.size() + t.size());
    return Value::string(s + t);
  }
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  auto type_error = [&]() {
    fail("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
  };
  if (a.is_number() && b.is_number()) {
    bool as_float = a.is_float() || b.is_float();
    if (op == "/") {
      BASALT_CHECK(b.as_double() != 0, "division by zero");
      return Value::number(a.as_double() / b.as_double());
    }
    if (as_float) {
      double x = a.as_double(), y = b.as_double();
      if (op == "+") return Value::number(x + y);
      if (op == "-") return Value::number(x - y);
      if (op == "*") return Value::number(x * y);
      if (op == "//") {
        BASALT_CHECK(y != 0, "float floor division by zero");
        return Value::number(std::floor(x / y));
      }
      if (op == "%") {
        BASALT_CHECK(y != 0, "float modulo");
        return Value::number(py_fmod(x, y));
      }
      if (op == "**") {
        BASALT_CHECK(!(x == 0 && y < 0), "0.0 cannot be raised to a negative power");
        return Value::number(std::pow(x, y));
      }
      type_error();
    }
    int64_t x = a.as_int(), y = b.as_int(), r = 0;
    if (op == "+") {
      BASALT_CHECK(checked_add(x, y, r), "integer overflow");
      return Value::integer(r);
    }
    if (op == "-") {
      BASALT_CHECK(checked_sub(x, y, r), "integer overflow");
      return Value::integer(r);
    }
    if (op == "*") {
      BASALT_CHECK(checked_mul(x, y, r), "integer overflow");
      return Value::integer(r);
    }
    if (op == "//") {
      BASALT_CHECK(y != 0, "integer division or modulo by zero");
      return Value::integer(floor_div(x, y));
    }
    if (op == "%") {
      BASALT_CHECK(y != 0, "integer division or modulo by zero");
      return Value::integer(py_mod(x, y));
    }
    if (op == "**") {
      if (y < 0) {
        BASALT_CHECK(x != 0, "0.0 cannot be raised to a negative power");
        return Value::number(std::pow(static_cast<double>(x), static_cast<double>(y)));
      }
      int64_t result = 1, base = x, e = y;
      while (e > 0) {
        if (e & 1) BASALT_CHECK(checked_mul(result, base, result), "integer overflow");
        e >>= 1;
        if (e > 0) BASALT_CHECK(checked_mul(base, base, base), "integer overflow");
      }
      return Value::integer(result);
    }
    type_error();
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.is_safe_string() || b.is_safe_string()) {
        std::string l = a.is_safe_string() ? a.as_string() : html_escape(a.as_string());
        std::string r = b.is_safe_string() ? b.as_string() : html_escape(b.as_string());
        check_string_size(l.size() + r.size());
        return Value::safe_string(l + r);
      }
      check_string_size(a.as_string().size() + b.as_string().size());
      return Value::string(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      check_list_size(a.items().size() + b.items().size());
      ValueList items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(items), a.is_tuple());
    }
    if (a.is_string()) fail("can only concatenate str (not \"{}\") to str", b.type_name());
    type_error();
  }
  if (op == "*") {
    const Value* seq = a.is_number() ? &b : &a;
    const Value* count = a.is_number() ? &a : &b;
    if ((seq->is_string() || seq->is_list()) && (count->is_int() || count->is_bool())) {
      int64_t n = std::max<int64_t>(0, count->as_int());
      if (seq->is_string()) {
        const std::string& s = seq->as_string();
        BASALT_CHECK(s.empty() || static_cast<uint64_t>(n) <= options_.max_output_bytes / s.size(),
                     "string repetition exceeds the limit of {} bytes", options_.max_output_bytes);
        std::string out;
        out.reserve(s.size() * static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) out += s;
        return Value::string(std::move(out));
      }
      const auto& items = seq->items();
      BASALT_CHECK(items.empty() || static_cast<uint64_t>(n) <= options_.max_list_items / items.size(),
                   "list repetition exceeds the limit of {} items", options_.max_list_items);
      ValueList out;
      for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
      return Value::list(std::move(out), seq->is_tuple());
    }
    type_error();
  }
  if (op == "%" && a.is_string()) {
    ValueList args = b.is_tuple() ? b.items() : ValueList{b};
    std::string s = percent_format(a.as_string(), args);
    check_string_size(s.size());
    return Value::string(std::move(s));
  }
  fail("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
}

}  // namespace basalt::jinja

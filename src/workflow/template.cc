// Templates: see template.h.
#include "workflow/template.h"

#include <fmt/format.h>

namespace basalt::workflow {
namespace {

bool name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool name_char(char c) { return name_start(c) || (c >= '0' && c <= '9'); }

// Reads a name at `pos`; empty when there is none.
std::string_view read_name(std::string_view s, size_t& pos) {
  const size_t start = pos;
  if (pos < s.size() && name_start(s[pos])) {
    ++pos;
    while (pos < s.size() && name_char(s[pos])) ++pos;
  }
  return s.substr(start, pos - start);
}

// The inside of one `{{ ... }}`; `column` (1-based) of its `{{` for errors.
TemplatePath parse_path(std::string_view inside, size_t column) {
  const auto bad = [&](std::string_view why) {
    return TemplateError(
        fmt::format("placeholder at column {} ('{{{{{}}}}}'): {}", column, inside, why));
  };
  size_t pos = 0;
  while (pos < inside.size() && inside[pos] == ' ') ++pos;
  const size_t begin = pos;
  TemplatePath path;
  path.root = std::string(read_name(inside, pos));
  if (path.root.empty()) throw bad("expected a name such as input, steps, item or index");
  while (pos < inside.size() && inside[pos] != ' ') {
    if (inside[pos] == '.') {
      ++pos;
      PathSelector sel;
      sel.field = std::string(read_name(inside, pos));
      if (sel.field.empty()) throw bad("expected a field name after '.'");
      path.selectors.push_back(std::move(sel));
    } else if (inside[pos] == '[') {
      ++pos;
      const size_t digits = pos;
      uint64_t n = 0;
      while (pos < inside.size() && inside[pos] >= '0' && inside[pos] <= '9' && pos - digits < 10) {
        n = n * 10 + static_cast<uint64_t>(inside[pos] - '0');
        ++pos;
      }
      if (pos == digits || pos >= inside.size() || inside[pos] != ']' || n >= (uint64_t{1} << 31))
        throw bad("expected '[N]' with a decimal index below 2^31");
      ++pos;
      PathSelector sel;
      sel.is_index = true;
      sel.index = static_cast<size_t>(n);
      path.selectors.push_back(std::move(sel));
    } else {
      throw bad(
          fmt::format("unexpected '{}': only names, '.field' and '[N]' are allowed", inside[pos]));
    }
  }
  path.text = std::string(inside.substr(begin, pos - begin));
  while (pos < inside.size() && inside[pos] == ' ') ++pos;
  if (pos != inside.size()) throw bad("one path only, without spaces inside it");
  return path;
}

void append_text(std::string& out, const nlohmann::json& value) {
  if (value.is_string())
    out += value.get_ref<const std::string&>();
  else
    out += value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void collect(const nlohmann::json& value, const std::string& where, std::vector<LocatedPath>& out) {
  if (value.is_string()) {
    Template t;
    try {
      t = Template::parse(value.get_ref<const std::string&>());
    } catch (const TemplateError& e) {
      throw TemplateError(where.empty() ? e.what() : where + ": " + e.what());
    }
    for (const TemplatePath* p : t.paths()) out.push_back({where, *p});
  } else if (value.is_object()) {
    for (const auto& [key, member] : value.items()) collect(member, where + "." + key, out);
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i)
      collect(value[i], fmt::format("{}[{}]", where, i), out);
  }
}

}  // namespace

Template Template::parse(std::string_view text) {
  Template t;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t open = text.find("{{", pos);
    if (open == std::string_view::npos) {
      t.pieces_.push_back({false, std::string(text.substr(pos)), {}});
      break;
    }
    if (open > pos) t.pieces_.push_back({false, std::string(text.substr(pos, open - pos)), {}});
    const size_t close = text.find("}}", open + 2);
    if (close == std::string_view::npos)
      throw TemplateError(fmt::format("'{{{{' at column {} has no closing '}}}}'", open + 1));
    Piece piece;
    piece.is_path = true;
    piece.path = parse_path(text.substr(open + 2, close - open - 2), open + 1);
    t.pieces_.push_back(std::move(piece));
    pos = close + 2;
  }
  return t;
}

bool Template::has_paths() const {
  for (const Piece& p : pieces_)
    if (p.is_path) return true;
  return false;
}

std::vector<const TemplatePath*> Template::paths() const {
  std::vector<const TemplatePath*> out;
  for (const Piece& p : pieces_)
    if (p.is_path) out.push_back(&p.path);
  return out;
}

nlohmann::json Template::render(const nlohmann::json& scope) const {
  if (whole_value()) return resolve_path(pieces_[0].path, scope);
  std::string out;
  for (const Piece& p : pieces_) {
    if (p.is_path)
      append_text(out, resolve_path(p.path, scope));
    else
      out += p.literal;
  }
  return out;
}

const nlohmann::json& resolve_path(const TemplatePath& path, const nlohmann::json& scope) {
  const auto missing = [&](const std::string& at, const std::string& why) {
    return TemplateError(fmt::format("'{}' does not resolve: {} {}", path.text, at, why));
  };
  const auto root = scope.is_object() ? scope.find(path.root) : scope.end();
  if (root == scope.end()) throw missing(path.root, "is not defined here");
  const nlohmann::json* at = &*root;
  std::string so_far = path.root;
  for (const PathSelector& sel : path.selectors) {
    if (sel.is_index) {
      if (!at->is_array()) throw missing(so_far, fmt::format("is {}, not a list", at->type_name()));
      if (sel.index >= at->size())
        throw missing(so_far, fmt::format("has {} items, no index {}", at->size(), sel.index));
      at = &(*at)[sel.index];
      so_far += fmt::format("[{}]", sel.index);
    } else {
      if (!at->is_object())
        throw missing(so_far, fmt::format("is {}, not an object", at->type_name()));
      const auto it = at->find(sel.field);
      if (it == at->end()) throw missing(so_far, fmt::format("has no field '{}'", sel.field));
      at = &*it;
      so_far += "." + sel.field;
    }
  }
  return *at;
}

nlohmann::json render_value(const nlohmann::json& value, const nlohmann::json& scope) {
  if (value.is_string()) return Template::parse(value.get_ref<const std::string&>()).render(scope);
  if (value.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [key, member] : value.items()) out[key] = render_value(member, scope);
    return out;
  }
  if (value.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const nlohmann::json& member : value) out.push_back(render_value(member, scope));
    return out;
  }
  return value;
}

std::vector<LocatedPath> collect_paths(const nlohmann::json& value) {
  std::vector<LocatedPath> out;
  collect(value, "", out);
  return out;
}

}  // namespace basalt::workflow

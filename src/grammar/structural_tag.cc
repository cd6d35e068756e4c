#include "grammar/structural_tag.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "core/error.h"
#include "grammar/ebnf.h"
#include "tokenizer/unicode.h"

namespace basalt {
namespace {

using ordered_json = nlohmann::ordered_json;

// The code points of a string (the JSON parser has checked its UTF-8).
std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> out;
  size_t at = 0;
  char32_t cp = 0;
  while (at < s.size()) {
    BASALT_CHECK(unicode::decode_utf8(s, at, cp), "a string is not valid UTF-8");
    out.push_back(static_cast<uint32_t>(cp));
  }
  return out;
}

std::string utf8(uint32_t cp) {
  std::string s;
  unicode::append_utf8(static_cast<char32_t>(cp), s);
  return s;
}

// Any code point but those listed, as an EBNF class.
std::string any_but(const std::set<uint32_t>& excluded) {
  if (excluded.empty()) return ".";
  std::string c = "[^";
  for (uint32_t cp : excluded) c += cp > 0xFFFF ? fmt::format("\\U{:08X}", cp) : fmt::format("\\u{:04X}", cp);
  return c + "]";
}

// The triggers' trie: a node per prefix; `complete` where a trigger ends.
struct Trie {
  struct Node {
    std::map<uint32_t, int> children;
    bool complete = false;
  };
  std::vector<Node> nodes{Node{}};

  void add(const std::vector<uint32_t>& word) {
    int at = 0;
    for (uint32_t cp : word) {
      auto it = nodes[static_cast<size_t>(at)].children.find(cp);
      if (it == nodes[static_cast<size_t>(at)].children.end()) {
        nodes.emplace_back();
        it = nodes[static_cast<size_t>(at)].children.emplace(cp, static_cast<int>(nodes.size()) - 1).first;
      }
      at = it->second;
    }
    nodes[static_cast<size_t>(at)].complete = true;
  }
  const Node& node(int i) const { return nodes[static_cast<size_t>(i)]; }
};

// "a | b | c": the alternatives of a choice.
std::string alternation(const std::vector<std::string>& alternatives) {
  std::string s;
  for (size_t i = 0; i < alternatives.size(); ++i) s += (i ? " | " : "") + alternatives[i];
  return s;
}

// Past a trie node (a partial trigger): the text may stop here, or go on
// down the trie without completing a trigger. Empty: nothing goes on.
std::string partial(const Trie& t, int v) {
  std::vector<std::string> alternatives;
  for (const auto& [cp, u] : t.node(v).children)
    if (!t.node(u).complete) {
      const std::string rest = partial(t, u);
      alternatives.push_back(ebnf_literal(utf8(cp)) + (rest.empty() ? "" : " " + rest));
    }
  if (alternatives.empty()) return "";
  return "(" + alternation(alternatives) + ")?";
}

// Past a trie node: down the trie, then a code point that neither goes on
// nor starts a trigger, which leaves every partial match behind.
std::string drop(const Trie& t, int v, const std::set<uint32_t>& firsts) {
  std::set<uint32_t> excluded = firsts;
  std::vector<std::string> alternatives;
  for (const auto& [cp, u] : t.node(v).children) {
    excluded.insert(cp);
    if (!t.node(u).complete) alternatives.push_back(ebnf_literal(utf8(cp)) + " " + drop(t, u, firsts));
  }
  alternatives.insert(alternatives.begin(), any_but(excluded));
  return "(" + alternation(alternatives) + ")";
}

const ordered_json& member(const ordered_json& o, const char* key, const std::string& where) {
  const auto it = o.find(key);
  BASALT_CHECK(it != o.end(), "{} needs '{}'", where, key);
  return *it;
}

}  // namespace

std::string structural_tag_to_ebnf(const ordered_json& spec, const JsonSchemaOptions& options) {
  BASALT_CHECK(spec.is_object(), "a structural tag must be an object with 'structures' and 'triggers'");
  for (const auto& [key, value] : spec.items())
    BASALT_CHECK(key == "structures" || key == "triggers" || key == "type",
                 "unknown field '{}' of the structural tag (structures and triggers are its fields{})", key,
                 key == "format" ? "; the 'format' form is not supported" : "");
  const ordered_json& structures = member(spec, "structures", "a structural tag");
  const ordered_json& triggers = member(spec, "triggers", "a structural tag");
  BASALT_CHECK(structures.is_array() && !structures.empty() && structures.size() <= kMaxStructuralTags,
               "'structures' must be an array of 1 to {} structures", kMaxStructuralTags);
  BASALT_CHECK(triggers.is_array() && !triggers.empty() && triggers.size() <= kMaxStructuralTriggers,
               "'triggers' must be an array of 1 to {} strings", kMaxStructuralTriggers);

  Trie trie;
  std::vector<std::string> trigger_texts;
  std::set<uint32_t> firsts;
  std::vector<std::vector<uint32_t>> words;
  for (size_t j = 0; j < triggers.size(); ++j) {
    BASALT_CHECK(triggers[j].is_string() && !triggers[j].get<std::string>().empty(),
                 "triggers[{}] must be a non-empty string", j);
    trigger_texts.push_back(triggers[j].get<std::string>());
    words.push_back(code_points(trigger_texts.back()));
    BASALT_CHECK(words.back().size() <= kMaxTriggerCodePoints, "triggers[{}] is longer than {} characters", j,
                 kMaxTriggerCodePoints);
    firsts.insert(words.back().front());
    trie.add(words.back());
  }
  for (size_t j = 0; j < words.size(); ++j)
    for (size_t k = 1; k < words[j].size(); ++k)
      BASALT_CHECK(!firsts.count(words[j][k]),
                   "triggers[{}] has '{}' past its first character, which starts a trigger: such triggers are not "
                   "supported",
                   j, utf8(words[j][k]));

  std::string ebnf = "root ::= st-text (st-tag st-text)*\n";
  // Text: code points that start no trigger, or partial triggers left by a
  // code point that does not continue them, then at the end partial
  // triggers. A first character that is a whole trigger never appears.
  std::vector<std::string> segs, drops;
  for (const auto& [cp, u] : trie.node(0).children) {
    if (trie.node(u).complete) continue;
    const std::string rest = partial(trie, u);
    segs.push_back(ebnf_literal(utf8(cp)) + (rest.empty() ? "" : " " + rest));
    drops.push_back(ebnf_literal(utf8(cp)) + " " + drop(trie, u, firsts));
  }
  if (segs.empty()) {
    ebnf += "st-text ::= " + any_but(firsts) + "*\n";
  } else {
    ebnf += "st-text ::= (" + any_but(firsts) + " | st-seg* st-drop)* st-seg*\n";
    ebnf += "st-seg ::= " + alternation(segs) + "\n";
    ebnf += "st-drop ::= " + alternation(drops) + "\n";
  }

  std::vector<std::string> tags;
  std::string parts;
  for (size_t i = 0; i < structures.size(); ++i) {
    const std::string where = fmt::format("structures[{}]", i);
    const ordered_json& s = structures[i];
    BASALT_CHECK(s.is_object(), "{} must be an object with 'begin', 'schema' and 'end'", where);
    for (const auto& [key, value] : s.items())
      BASALT_CHECK(key == "begin" || key == "schema" || key == "end", "unknown field '{}' of {}", key, where);
    const ordered_json& begin = member(s, "begin", where);
    const ordered_json& end = member(s, "end", where);
    const ordered_json& schema = member(s, "schema", where);
    BASALT_CHECK(begin.is_string() && !begin.get<std::string>().empty(), "{}.begin must be a non-empty string", where);
    BASALT_CHECK(end.is_string(), "{}.end must be a string", where);
    BASALT_CHECK(schema.is_object() || schema.is_boolean(), "{}.schema must be a JSON schema (an object)", where);
    const std::string& b = begin.get_ref<const std::string&>();
    BASALT_CHECK(std::any_of(trigger_texts.begin(), trigger_texts.end(),
                             [&](const std::string& t) { return b.compare(0, t.size(), t) == 0; }),
                 "{}.begin \"{}\" must start with one of the triggers", where, b);
    JsonSchemaOptions o = options;
    o.rule_prefix = fmt::format("st{}-", i);
    std::string rules;
    try {
      rules = json_schema_to_ebnf(schema, o);
    } catch (const Error& e) {
      fail("{}.schema: {}", where, e.what());
    }
    parts += rules + "\n";
    tags.push_back(fmt::format("{} {}root {}", ebnf_literal(b), o.rule_prefix, ebnf_literal(end.get<std::string>())));
  }
  ebnf += "st-tag ::= " + alternation(tags) + "\n" + parts;
  return ebnf;
}

}  // namespace basalt

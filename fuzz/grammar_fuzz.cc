// libFuzzer target: the structured-output compilers on untrusted specs. The
// first byte picks the input's kind (an EBNF grammar, an ECMAScript regex in
// either mode, a JSON schema); the rest is the spec. Whatever compiles is
// matched against a few texts and masked over a small vocabulary; where
// the grammar has distinct rules (uniqueItems), a DistinctJson follows the
// text byte by byte, filters the masks and goes back with the matcher, and
// where it has bounded rules (maxLength kept at run time) a BoundedStrings
// does the same.
// Every failure must be a basalt::Error; nothing may crash, leak or hang.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "grammar/bounded_string.h"
#include "grammar/distinct_json.h"
#include "grammar/ebnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "grammar/token_mask.h"

namespace {

const std::shared_ptr<const basalt::TokenVocabulary>& vocabulary() {
  static const auto v = [] {
    std::vector<std::string> bytes = {"</s>"};
    for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
    for (const char* t : {"{\"", "\":", "\",", "\"}", "true", "null", "12", "ab", "\\n", "\xC3\xA9", "[[", "]]"})
      bytes.emplace_back(t);
    std::vector<bool> usable(bytes.size(), true);
    usable[0] = false;
    const auto n = static_cast<int32_t>(bytes.size());
    return std::make_shared<const basalt::TokenVocabulary>(std::move(bytes), std::move(usable), n,
                                                           std::vector<int32_t>{0});
  }();
  return v;
}

// The run-time half of uniqueItems, as GrammarConstraint drives it, one
// byte per step (so the matcher can say what each `[` opened); odd bytes
// the grammar refuses take a step back.
void exercise_distinct(const std::shared_ptr<const basalt::CompiledGrammar>& grammar, std::string_view text) {
  basalt::GrammarMatcher m(grammar);
  if (!m.has_distinct_rules()) return;
  const basalt::TokenMasker masker(grammar, vocabulary());
  basalt::DistinctJson distinct;
  std::vector<uint32_t> words(static_cast<size_t>((vocabulary()->size() + 31) / 32));
  for (size_t i = 0; i < text.size() && i < 96; ++i) {
    masker.fill(m, words);
    distinct.filter(m, *vocabulary(), words);
    const auto b = static_cast<uint8_t>(text[i]);
    if (!m.accept_bytes(text.substr(i, 1))) {
      if ((b & 1) != 0 && m.history() > 0) {
        m.rollback(1);
        distinct.rewind(distinct.size() - 1);
      }
      continue;
    }
    distinct.accept(b, distinct.wants_opener(b) ? m.opened_distinct() : basalt::GrammarMatcher::Distinct::kNo);
  }
}

// The run-time half of a bounded string's maxLength, the same way.
void exercise_bounded(const std::shared_ptr<const basalt::CompiledGrammar>& grammar, std::string_view text) {
  basalt::GrammarMatcher m(grammar);
  if (!m.has_bounded_rules()) return;
  const basalt::TokenMasker masker(grammar, vocabulary());
  basalt::BoundedStrings bounded;
  std::vector<basalt::BoundedStrings::Snapshot> before;
  std::vector<uint32_t> words(static_cast<size_t>((vocabulary()->size() + 31) / 32));
  for (size_t i = 0; i < text.size() && i < 96; ++i) {
    masker.fill(m, words);
    bounded.filter(*vocabulary(), words);
    const auto b = static_cast<uint8_t>(text[i]);
    if (!m.accept_bytes(text.substr(i, 1))) {
      if ((b & 1) != 0 && m.history() > 0) {
        m.rollback(1);
        bounded.restore(before.back());
        before.pop_back();
      }
      continue;
    }
    before.push_back(bounded.snapshot());
    if (bounded.active()) {
      bounded.accept(b);
    } else if (const basalt::BoundedRegion* region = b == '"' ? m.opened_bounded() : nullptr) {
      bounded.begin(*region);
    }
  }
}

void exercise(const std::string& ebnf, std::string_view text) {
  const auto grammar = basalt::compile_grammar(basalt::parse_ebnf(ebnf));
  exercise_distinct(grammar, text);
  exercise_bounded(grammar, text);
  exercise_bounded(grammar, R"({"a":"abcdefgh\n\u001fÃ©xyz","b":["http://x.io/a b","a@b.co"]})");
  exercise_distinct(grammar, R"([1,1,"a","a",[1],[1],{"a":1,"a":1},1.0,{"b":[2]},{"b":[2]}])");
  basalt::GrammarMatcher m(grammar);
  const basalt::TokenMasker masker(grammar, vocabulary());
  std::vector<uint32_t> words(static_cast<size_t>((vocabulary()->size() + 31) / 32));
  masker.fill(m, words);
  // Feed the text in pieces; on a refused piece, go back one and go on.
  for (size_t i = 0; i < text.size() && i < 64; i += 3) {
    if (m.accept_bytes(text.substr(i, 3))) {
      masker.fill(m, words);
    } else if (m.history() > 0) {
      m.rollback(1);
    }
  }
  m.forced_bytes(32);
  m.can_end();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string spec(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    switch (data[0] % 4) {
      case 0:
        exercise(spec, spec);
        break;
      case 1:
      case 2: {
        const basalt::RegexRules r = basalt::regex_to_ebnf(
            spec, data[0] % 4 == 1 ? basalt::RegexMode::kFullMatch : basalt::RegexMode::kSearch,
            (data[0] & 4) != 0, "re-");
        exercise("root ::= " + r.root + "\n" + r.rules, spec);
        break;
      }
      default: {
        const auto schema = nlohmann::ordered_json::parse(spec, nullptr, /*allow_exceptions=*/false);
        if (schema.is_discarded()) return 0;
        basalt::JsonSchemaOptions options;
        options.compact = (data[0] & 4) == 0;
        exercise(basalt::json_schema_to_ebnf(schema, options), "{\"a\":1}");
        break;
      }
    }
  } catch (const basalt::Error&) {
  }
  return 0;
}

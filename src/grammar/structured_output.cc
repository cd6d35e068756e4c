#include "grammar/structured_output.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/ebnf.h"
#include "grammar/json_schema.h"
#include "grammar/structural_tag.h"
#include "grammar/regex.h"

namespace basalt {

const char* to_string(StructuredOutputSpec::Kind kind) {
  switch (kind) {
    case StructuredOutputSpec::Kind::kJsonObject: return "json_object";
    case StructuredOutputSpec::Kind::kJsonSchema: return "json_schema";
    case StructuredOutputSpec::Kind::kRegex: return "regex";
    case StructuredOutputSpec::Kind::kChoice: return "choice";
    case StructuredOutputSpec::Kind::kGrammar: return "grammar";
    case StructuredOutputSpec::Kind::kStructuralTag: return "structural_tag";
  }
  return "?";
}

std::string StructuredOutputSpec::key() const {
  return fmt::format("{}/{}/{}", to_string(kind), compact_json ? "compact" : "flexible", text);
}

std::string to_ebnf(const StructuredOutputSpec& spec) {
  JsonSchemaOptions json_options;
  json_options.compact = spec.compact_json;
  switch (spec.kind) {
    case StructuredOutputSpec::Kind::kJsonObject:
      return json_object_ebnf(json_options);
    case StructuredOutputSpec::Kind::kJsonSchema: {
      const nlohmann::ordered_json schema =
          nlohmann::ordered_json::parse(spec.text, nullptr, /*allow_exceptions=*/false);
      BASALT_CHECK(!schema.is_discarded(), "the JSON schema is not valid JSON");
      return json_schema_to_ebnf(schema, json_options);
    }
    case StructuredOutputSpec::Kind::kRegex: {
      const RegexRules r = regex_to_ebnf(spec.text, RegexMode::kFullMatch, /*json_escaped=*/false, "re-");
      return fmt::format("root ::= {}\n{}", r.root, r.rules);
    }
    case StructuredOutputSpec::Kind::kChoice: {
      const nlohmann::json choices = nlohmann::json::parse(spec.text, nullptr, /*allow_exceptions=*/false);
      BASALT_CHECK(choices.is_array() && !choices.empty(), "the choices must be a non-empty list of strings");
      std::string ebnf = "root ::=";
      for (size_t i = 0; i < choices.size(); ++i) {
        BASALT_CHECK(choices[i].is_string(), "choice {} is not a string", i);
        ebnf += fmt::format("{} {}", i == 0 ? "" : " |", ebnf_literal(choices[i].get<std::string>()));
      }
      return ebnf;
    }
    case StructuredOutputSpec::Kind::kGrammar:
      return spec.text;
    case StructuredOutputSpec::Kind::kStructuralTag: {
      const nlohmann::ordered_json tag = nlohmann::ordered_json::parse(spec.text, nullptr, /*allow_exceptions=*/false);
      BASALT_CHECK(!tag.is_discarded(), "the structural tag is not valid JSON");
      return structural_tag_to_ebnf(tag, json_options);
    }
  }
  fail("unknown structured output kind");
}

GrammarCache::GrammarCache(std::shared_ptr<const TokenVocabulary> vocabulary, size_t capacity)
    : vocabulary_(std::move(vocabulary)), capacity_(std::max<size_t>(capacity, 1)) {}

std::shared_ptr<const TokenMasker> GrammarCache::get(const StructuredOutputSpec& spec) {
  const std::string key = spec.key();
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = slots_.find(key);
    if (it != slots_.end()) {
      order_.splice(order_.begin(), order_, it->second.position);
      ++stats_.hits;
      return it->second.masker;
    }
  }
  // Compiled unlocked: a slow grammar does not hold up cache hits.
  const auto start = std::chrono::steady_clock::now();
  auto masker = std::make_shared<const TokenMasker>(compile_grammar(parse_ebnf(to_ebnf(spec))), vocabulary_);
  {
    GrammarMatcher first(masker->grammar());
    std::vector<uint32_t> words(static_cast<size_t>((vocabulary_->size() + 31) / 32));
    masker->fill(first, words);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.misses;
  stats_.compile_seconds += seconds;
  const auto it = slots_.find(key);
  if (it != slots_.end()) return it->second.masker;  // another thread compiled it meanwhile
  order_.push_front(key);
  slots_.emplace(key, Slot{masker, order_.begin()});
  while (slots_.size() > capacity_) {
    slots_.erase(order_.back());
    order_.pop_back();
  }
  return masker;
}

GrammarCache::Stats GrammarCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace basalt

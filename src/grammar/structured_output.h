// StructuredOutput: what a request's output must match, in each form the
// APIs take (OpenAI's response_format, vLLM's structured_outputs and
// guided_*, SGLang's and vLLM's structural tags), translated to EBNF and compiled into a TokenMasker that every
// request with the same spec shares.
//
// Contract: to_ebnf() and GrammarCache::get() throw basalt::Error whose
// message says what is wrong with the spec (a JSON Schema keyword and its
// path, a regex construct and its offset, a grammar's line:column). The
// cache is thread-safe, keeps the most recently used `capacity` grammars,
// and computes each new grammar's first mask before returning it, so the
// first step of the request that brought it does not pay for it.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "grammar/token_mask.h"

namespace basalt {

struct StructuredOutputSpec {
  enum class Kind : uint8_t {
    kJsonObject,  // any JSON object
    kJsonSchema,  // text: the schema as JSON
    kRegex,       // text: an ECMAScript regex the whole output matches
    kChoice,      // text: a JSON array of strings, one of which is the output
    kGrammar,     // text: EBNF (grammar/ebnf.h), from the rule "root"
    kStructuralTag,  // text: {"structures": [...], "triggers": [...]} (grammar/structural_tag.h)
  };
  Kind kind = Kind::kJsonObject;
  std::string text;
  bool compact_json = true;  // no whitespace between JSON tokens

  std::string key() const;
};

const char* to_string(StructuredOutputSpec::Kind kind);

std::string to_ebnf(const StructuredOutputSpec& spec);

class GrammarCache {
 public:
  explicit GrammarCache(std::shared_ptr<const TokenVocabulary> vocabulary, size_t capacity = 256);

  std::shared_ptr<const TokenMasker> get(const StructuredOutputSpec& spec);
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }

  struct Stats {
    uint64_t hits = 0, misses = 0;
    double compile_seconds = 0;  // spent on misses, first masks included
  };
  Stats stats() const;

 private:
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::string> order_;  // most recent first
  struct Slot {
    std::shared_ptr<const TokenMasker> masker;
    std::list<std::string>::iterator position;
  };
  std::unordered_map<std::string, Slot> slots_;
  Stats stats_;
};

}  // namespace basalt

// Structural tags (SGLang's and vLLM's response_format of type
// "structural_tag", XGrammar's first form of it): free text in which any of
// the `triggers` may appear only as the start of one of the `structures`,
// each its `begin` string, then a JSON value its `schema` allows, then its
// `end` string; the text may end between structures, never inside one.
//
// Contract: structural_tag_to_ebnf() takes {"structures": [{"begin",
// "schema", "end"}, ...], "triggers": [...]} (as the APIs send it) and
// returns EBNF (grammar/ebnf.h) with rule "root":
//   root ::= text (tag text)*
// where text is every string in which no trigger occurs, and tag is one of
// the structures (the JSON of each as json_schema_to_ebnf writes it with
// `options`, its rules prefixed). The text rule is written without
// recursion, as a repetition over the triggers' trie, which needs that no
// trigger's first character occurs in any trigger past its first position
// ("<function=", "<tool_call>", "[TOOL_CALLS]" pass; "aba" does not):
// such triggers are refused with a message that says so. Every `begin`
// must start with a trigger. Errors throw basalt::Error naming the field
// (structures[i].begin, triggers[j], ...) and what is wrong with it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "grammar/json_schema.h"

namespace basalt {

inline constexpr size_t kMaxStructuralTags = 64;
inline constexpr size_t kMaxStructuralTriggers = 16;
inline constexpr size_t kMaxTriggerCodePoints = 64;

std::string structural_tag_to_ebnf(const nlohmann::ordered_json& spec, const JsonSchemaOptions& options = {});

}  // namespace basalt

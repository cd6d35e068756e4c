// JSON Schema to EBNF (grammar/ebnf.h): the grammar of every JSON text an
// instance of the schema may be written as, in the one form this module fixes,
// so that a model constrained by it writes a valid instance.
//
// The form: compact (the default) is nlohmann::json::dump()'s, no whitespace at
// all; strings escaped as dump() escapes them (\" \\ \b \f \n \r \t, other
// control characters as \u00xx in lowercase hex, all else raw UTF-8); integers
// as -?(0|[1-9][0-9]*) without "-0"; numbers as JSON allows them (fraction and
// exponent); object members in the order the schema lists `properties` (then
// the names `required` adds, in its order), the optional ones free to be
// absent, then, unless additionalProperties is false, any number of further
// members (their keys any string but the names in properties and required,
// which only their own schemas decide). Flexible (compact = false): JSON
// whitespace between tokens, at most max_whitespace characters in a row, none
// before or after the value. enum and const values are written as dump() writes
// them, so their objects and arrays are compact in flexible mode too.
//
// Keywords (draft 2020-12 and the older drafts real schemas use): type (and
// type lists), properties, required, additionalProperties (true unless given,
// as the specification says), minProperties / maxProperties (over listed and
// further members alike), items / prefixItems (and draft-4 array `items` with
// additionalItems), minItems / maxItems, uniqueItems: false, enum, const (with
// `type` beside them and nothing else), anyOf, oneOf (as anyOf: a value that
// matches several branches is accepted too), allOf (merged: types intersected,
// properties and items combined branch against branch, required united, bounds
// tightened; equal patterns or formats only), keywords beside $ref (merged as
// allOf), $ref / $defs / definitions (JSON pointers within the document, "#"
// and the root's $id included; recursion through objects or arrays; one rule
// per referenced schema), pattern (ECMAScript, grammar/regex.h), format (date,
// time, date-time as RFC 3339, with a leap second only as 23:59:60 in UTC;
// email as RFC 5321's mailbox: dot-atom or quoted local part, hostname or
// address-literal domain; uuid; ipv4 and ipv6 as RFC 3986 writes them; uri as
// RFC 3986's URI; hostname as RFC 1123 labels of at most 63 characters, at most
// 127 labels, the total length of 253 not enforced), minLength / maxLength
// (code points, an escape counting one), minimum / maximum / exclusiveMinimum /
// exclusiveMaximum on integers (draft 4's boolean exclusive forms too) as the
// exact decimal language of the range. Annotations are ignored: title,
// description, default, examples, example, $comment, $schema, $id (at the
// root), $anchor, $dynamicAnchor, $recursiveAnchor, $vocabulary, deprecated,
// readOnly, writeOnly, contentEncoding, contentMediaType, contentSchema,
// discriminator (OpenAPI's: the branches it selects between are enforced).
//
// Contract: every other keyword throws basalt::Error naming it and the schema
// path as a JSON pointer ("unsupported keyword \"not\" at #/properties/a"), so
// a typo or an assertion the translation cannot enforce is never silently
// ignored: if/then/else, not, dependentSchemas, dependentRequired,
// dependencies, patternProperties, propertyNames, unevaluatedProperties,
// unevaluatedItems, contains, multipleOf, uniqueItems: true, $dynamicRef,
// bounds on non-integer numbers, pattern or format together with length bounds,
// an unknown format, an allOf whose branches do not merge, $id below the root,
// a $ref outside the document or to an anchor, a $ref cycle that reaches itself
// before any JSON text. A schema that no value satisfies (false at the root,
// minItems > maxItems, a required property whose schema is false, an empty
// enum, an empty integer range, a recursion that never ends) is an error too; a
// part of it that no value satisfies (an anyOf branch, an optional property) is
// left out.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

namespace basalt {

struct JsonSchemaOptions {
  // Compact: no whitespace between tokens, `{"a":1,"b":[2,3]}` (as
  // nlohmann::json::dump() writes and OpenAI's strict mode produces).
  // Flexible: JSON whitespace allowed between tokens, at most
  // max_whitespace characters in a row (so a model cannot loop on it).
  bool compact = true;
  int max_whitespace = 8;
  // Put before every rule name the translation defines, "root" included (so
  // rule_prefix + "root" starts the schema), so that several translations
  // can be parts of one grammar without their rules colliding. Name
  // characters only ([A-Za-z0-9_.-]), not starting with '.', which the EBNF
  // reads as "any code point". Empty: the names as they are.
  std::string rule_prefix;
};

// EBNF text with a rule named "root" (rule_prefix + "root"). The schema is
// an ordered_json because property order is the order of the object's
// members: parse the request with nlohmann::ordered_json::parse (a
// nlohmann::json converts, but its keys are sorted by then).
std::string json_schema_to_ebnf(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});

// Any JSON object (OpenAI's response_format json_object).
std::string json_object_ebnf(const JsonSchemaOptions& options = {});

}  // namespace basalt

// JSON Schema to EBNF (grammar/ebnf.h): the grammar of every JSON text an
// instance of the schema may be written as, in the one form this module fixes,
// so that a model constrained by it writes a valid instance.
//
// The form: compact (the default) is nlohmann::json::dump()'s, no whitespace at
// all; strings escaped as dump() escapes them (\" \\ \b \f \n \r \t, other
// control characters as \u00xx in lowercase hex, all else raw UTF-8); integers
// as -?(0|[1-9][0-9]*) without "-0"; numbers as JSON allows them (fraction and
// exponent), or, where minimum / maximum bound them, without an exponent and
// without "-0" (every value in range has such a spelling); object members in the order the schema lists `properties` (then
// the names `required` adds, in its order), the optional ones free to be
// absent, then, unless additionalProperties is false, any number of further
// members (their keys any string but the names in properties and required,
// which only their own schemas decide; with patternProperties, names that
// match a pattern, below). Flexible (compact = false): JSON
// whitespace between tokens, at most max_whitespace characters in a row, none
// before or after the value. enum and const values are written as dump() writes
// them, so their objects and arrays are compact in flexible mode too.
//
// Keywords (draft 2020-12 and the older drafts real schemas use): type (and
// type lists), properties, required, additionalProperties (true unless given,
// as the specification says), patternProperties, propertyNames, dependentRequired,
// dependentSchemas and dependencies (below), minProperties / maxProperties
// (over listed and further members alike), items / prefixItems (and draft-4 array `items` with
// additionalItems), minItems / maxItems, uniqueItems (true: the array is
// written by a distinct rule, grammar/ebnf.h, whose repeats the matcher's
// users take out at run time, grammar/distinct_json.h), if / then / else
// (the allOf of the schema without them and the anyOf of [if, then] and
// [not if, else], where `not if` is a not the translation takes or the
// discriminator form: properties whose schemas not takes, required and type
// object), enum, const (the
// values that satisfy the type, minLength / maxLength, pattern and number
// bounds beside them, each checked on the value; no other assertion beside
// them), anyOf, oneOf (below), allOf (merged:
// types intersected, properties and items combined branch against branch,
// required united, bounds tightened; equal patterns or formats only),
// keywords beside $ref (merged as allOf), $ref / $defs / definitions (JSON
// pointers within the document, "#" and the root's $id or draft 4's id
// included; recursion through objects or arrays; one rule per referenced
// schema), pattern (ECMAScript, grammar/regex.h), format (date, time,
// date-time as RFC 3339, with a leap second only as 23:59:60 in UTC; email as
// RFC 5321's mailbox in the form every validator takes: a dot-atom local
// part and a domain of two labels or more (quoted local parts, one-label
// domains and address literals, which Ajv's format refuses, are not
// written); uuid; ipv4 and ipv6 as RFC 3986 writes them; uri as
// RFC 3986's URI, and url as uri; uri-reference as RFC 3986's URI-reference;
// duration as RFC 3339's (appendix A); json-pointer as RFC 6901's and
// relative-json-pointer as a count of levels then '#' or a JSON pointer;
// hostname as RFC 1123 labels of at most 63
// characters, any number of them, the total length of 253 not enforced;
// OpenAPI's byte as RFC 4648 base64 (standard alphabet, padded, the padding's
// bits zero), its password and binary as any string; on numbers, OpenAPI's
// int32 and int64 as integers in their range, float and double as any number,
// and a format for strings as nothing), minLength / maxLength (code points, an
// escape counting one), minimum / maximum / exclusiveMinimum /
// exclusiveMaximum (draft 4's boolean exclusive forms too) on integers as the
// exact decimal language of the range, and on numbers as the exact language
// of the range over decimal text (integer part, then fraction digits compared
// with the bound's, which is the exact decimal of the JSON number: the
// shortest that reads back as its double).
//
// patternProperties: a listed name (properties, required) satisfies the
// schema of each pattern that matches it (ECMAScript, unanchored) besides
// its own; the further names (all but the listed ones) are split by which
// patterns match them, each split an intersection of pattern languages and
// their complements built as automata (RegexLanguage, grammar/regex.h), and
// each is one member form whose value satisfies the schemas of exactly the
// patterns that match, or additionalProperties where none does; exact.
// propertyNames (type, pattern, minLength / maxLength, enum, const, allOf
// and $ref of those; other assertions refused): listed names it refuses are
// left out (a required one admits no object), further names are
// intersected with it; exact. A pattern beside minLength / maxLength is
// their intersection; exact. Where a pattern's or format's automaton times
// maxLength + 1 passes RegexLanguage::kMaxStates, the string is written
// without its upper bound in a bounded rule (grammar/ebnf.h) and the bound
// is kept at run time (grammar/bounded_string.h); exact. Other automata
// past RegexLanguage::kMaxStates are refused by name. not: of a boolean schema, or of one whose assertions
// are type, enum, const and pattern (anyOf of those too, as merging writes
// two nots): the values it matches are taken away (whole types; strings
// listed or matching the pattern, as an automaton; true, false, null);
// a not of required names alone (or anyOf / allOf of such) is the objects
// that lack one of them; lists of numbers, objects or arrays, and not
// integer beside number, are refused; exact. multipleOf: 1 (integers); other divisors refused.
// dependentRequired,
// dependentSchemas and draft 7's dependencies (arrays and schemas): the
// object is one of the combinations of its triggers present (required, with
// what they require or bring merged in as allOf) or absent (false), each
// its own object grammar; exact.
//
// oneOf is the anyOf of its branches where no value can match two of them,
// and refused elsewhere. A type that two branches admit whole (every value of
// it: {} and {"type": "number"} both admit every number) is left out, as
// every value of it matches both and is invalid (where that leaves the
// numbers that are not integers, which no type names, they go too: the
// grammar may lose valid values, never admit invalid ones). On the types
// left, each two
// branches (with the keywords beside oneOf merged in) must be proven
// disjoint: their types do not meet (from `type`, or from the types of their
// const / enum values); or their const / enum values differ; or, as objects,
// both require a property whose values are disjoint in turn (the
// discriminator pattern, {"properties": {"kind": {"const": "a"}}, "required":
// ["kind"]}), or one requires a name the other does not allow
// (additionalProperties false, no patternProperties); or, as strings, their
// patterns' automata do not intersect. $ref, allOf and anyOf inside a branch
// are followed. A branch
// that admits no value (false, an empty range) overlaps nothing; inside allOf
// or beside $ref only where that shows without translating it. In drafts 4 to
// 7 (as $schema names them) the keywords beside a $ref count for none of
// these proofs, as those drafts ignore them. Where the proof fails,
// branches that overlap only in {} (closed objects allowing no name in
// common) or [] (arrays whose items are proven apart) each get minProperties
// or minItems 1, exactly (that value matches both, so it is invalid); then two
// rewrites: branches that require names ([{"required": ["radius"]},
// {"required": ["length", "width"]}]) each become an object that lacks, for
// every other branch not proven apart, one of that branch's names it does not
// require (a branch that requires all of another's is dropped where the other
// admits every object that has them): exact for branches of `required` alone,
// narrower where branches have other keywords (the objects that fail a branch
// otherwise, and non-objects, are not written). Else branches that each list
// a property in `properties` with const / enum values apart from the others'
// ({"properties": {"kind": {"enum": ["a"]}}}) get that property required, and
// are proven again: narrower (objects without the property are not written).
//
// Keys: every keyword of the JSON Schema vocabularies (drafts 4 to 2020-12:
// core, applicator, unevaluated, validation, format, content, meta-data, with
// draft 4 to 7's definitions, dependencies, additionalItems and id, and draft
// 3's divisibleBy, disallow and extends) is enforced as above, ignored as an
// annotation (title, description, default, examples, $comment, $schema,
// $anchor, $dynamicAnchor, $recursiveAnchor, $vocabulary, deprecated,
// readOnly, writeOnly, contentEncoding, contentMediaType, contentSchema; $id
// and id as below), or refused (the contract). Any other key is no JSON Schema
// keyword (vendor extensions such as x-kubernetes-*, OpenAPI's nullable,
// discriminator and example, Snowplow's self, misspellings such as
// "minlength"): it is an annotation, ignored as the specification says
// (2019-09 on, "unknown keywords") and as validators do, so a misspelt keyword
// asserts nothing. $id, or draft 4's id (a string): at the root it names the
// document. Below the root, a fragment ("#name") only names its schema; any
// other identifier is a new base URI for the schema under it, which matters
// only to the $refs resolved against it. The translation resolves every $ref
// as a JSON pointer into this document (a $ref that names the identifier
// instead is no such pointer, and is refused as remote), so the identifier is
// an annotation while no $ref lies inside its schema, and refused otherwise,
// as is a $ref that points into such a schema past it.
//
// Contract: every keyword of those vocabularies that the translation cannot
// enforce throws basalt::Error naming it and the schema path as a JSON
// pointer ("unsupported keyword \"not\" at #/properties/a"), so an assertion
// is never silently ignored: an if whose failing values cannot be written,
// not, propertyNames,
// unevaluatedProperties, unevaluatedItems, contains, minContains,
// maxContains, multipleOf, $dynamicRef, $recursiveRef,
// divisibleBy, disallow, extends, pattern or format together with length
// bounds, an unknown format, an allOf whose branches do not merge (one that
// combines patternProperties with another schema's properties among them),
// a patternProperties pattern that matches a listed name (and neither every
// name nor only that one), more than 64 combinations of dependency
// triggers, a oneOf whose branches may overlap and neither rewrite tells apart
// ("unsupported keyword \"oneOf\" at #: its branches 0 and 1 may overlap"),
// an assertion beside enum or const other than those above, an $id or id
// below the root with a $ref inside, a $ref outside the document or to an
// anchor, a $ref cycle that reaches itself before any JSON text. A schema that
// no value satisfies (false at the root, minItems > maxItems, a required
// property whose schema is false, an empty enum, an empty integer range, a
// recursion that never ends, a oneOf of two true branches) is an error too; a
// part of it that no value satisfies (an anyOf or oneOf branch, an optional
// property) is left out.
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

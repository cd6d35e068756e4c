// uniqueItems through GrammarConstraint (grammar/distinct_json.h): the
// masks take out the tokens that would repeat an item, compared as JSON
// values; finite item domains run out without a dead end; nested and
// surrounding text is tracked; rollback restores the items.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/ebnf.h"
#include "grammar/structured_output.h"
#include "runtime/grammar_constraint.h"
#include "testing/constraint_walk_test_util.h"

namespace basalt {
namespace {

using testing::ConstraintWalk;
using Walk = ConstraintWalk;

std::shared_ptr<const TokenMasker> masker_for(StructuredOutputSpec spec) {
  // Every byte as a token, and pieces that cross JSON's punctuation.
  static const auto v = testing::byte_vocabulary({"\",\"", "\"]", "\",", "],[", "]]", "[[", "1,", "1]", "1.0", ".0",
                                                  "\"a\"", "\"a", "\"b", "ab", "{\"", "\":", "},{", "}]", "true",
                                                  "false", ",\"", "\"}", "12", "\\u0041"});
  return testing::masker_of(to_ebnf(spec), v);
}

std::shared_ptr<const TokenMasker> schema(const char* text) {
  return masker_for({StructuredOutputSpec::Kind::kJsonSchema, text});
}

bool all_distinct(const nlohmann::json& array) {
  for (size_t i = 0; i < array.size(); ++i)
    for (size_t j = i + 1; j < array.size(); ++j)
      if (array[i] == array[j]) return false;
  return true;
}

TEST(DistinctItems, TheGrammarAloneAllowsRepeatsTheMasksDoNot) {
  const char* text = R"({"type": "array", "items": {"type": "integer"}, "uniqueItems": true})";
  const std::string ebnf = to_ebnf({StructuredOutputSpec::Kind::kJsonSchema, text});
  EXPECT_NE(ebnf.find(kDistinctRulePrefix), std::string::npos) << ebnf;
  // Integers are endless: no new item can run out, and the rule says so.
  EXPECT_NE(ebnf.find(kOpenDistinctRulePrefix), std::string::npos) << ebnf;
  const std::string finite = to_ebnf({StructuredOutputSpec::Kind::kJsonSchema,
                                      R"({"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": true})"});
  EXPECT_NE(finite.find(kDistinctRulePrefix), std::string::npos) << finite;
  EXPECT_EQ(finite.find(kOpenDistinctRulePrefix), std::string::npos) << finite;
  EXPECT_TRUE(grammar_matches(parse_ebnf(ebnf), "[1,1]"));
  Walk w(schema(text));
  w.write("[1,2,1");
  EXPECT_FALSE(w.allows(","));
  EXPECT_FALSE(w.allows("]"));
  EXPECT_TRUE(w.allows("0"));  // 10 is new
  w.write("0,12");
  EXPECT_TRUE(w.allows("]"));
}

TEST(DistinctItems, ItemsAreComparedAsJsonValues) {
  {
    Walk w(schema(R"({"type": "array", "items": {"type": "number"}, "uniqueItems": true})"));
    w.write("[1,1.0");
    EXPECT_FALSE(w.allows(","));
    EXPECT_FALSE(w.allows("]"));
    EXPECT_TRUE(w.allows("5"));  // 1.05
  }
  {
    Walk w(schema(R"({"type": "array", "uniqueItems": true})"));
    w.write(R"([{"a":1,"b":[2]},{"b":[2],"a":1)");
    // The object is whole and equal to the first: no way on from here.
    EXPECT_FALSE(w.allows("}"));
    w.write(",");
    w.write(R"("c":null})");
    EXPECT_TRUE(w.allows("]"));
  }
}

// Inner arrays without uniqueItems may repeat; the outer items may not.
TEST(DistinctItems, OnlyTheArraysThatAskAreDistinct) {
  Walk w(schema(R"({"type": "array", "uniqueItems": true, "items": {"type": "array", "items": {"type": "integer"}}})"));
  w.write("[[1,1],[1,1");
  EXPECT_TRUE(w.allows(","));
  EXPECT_FALSE(w.allows("]"));
  w.write(",1]");
  EXPECT_TRUE(w.allows("]"));
}

// Finite item domains: with minItems equal to their size, every sample is
// a permutation of the whole domain, and no mask on the way is empty.
TEST(DistinctItems, FiniteDomainsRunOutWithoutDeadEnds) {
  struct Case {
    const char* schema;
    size_t size;
  };
  const Case cases[] = {
      {R"({"type": "array", "uniqueItems": true, "minItems": 3, "items": {"enum": ["a", "ab", "b"]}})", 3},
      {R"({"type": "array", "uniqueItems": true, "minItems": 4,
           "items": {"type": "integer", "minimum": 9, "maximum": 12}})", 4},
      {R"({"type": "array", "uniqueItems": true, "minItems": 7, "items": {"type": "string", "pattern": "^[ab]{0,2}$"}})",
       7},
      {R"({"type": "array", "uniqueItems": true, "minItems": 3, "items": {"type": ["boolean", "null"]}})", 3},
      {R"({"type": "array", "uniqueItems": true, "minItems": 2,
           "prefixItems": [{"const": 1}], "items": {"type": "integer", "minimum": 1, "maximum": 2}})", 2},
  };
  for (const Case& k : cases) {
    const auto m = schema(k.schema);
    for (uint32_t seed = 0; seed < 40; ++seed) {
      std::mt19937 rng(seed);
      Walk w(m);
      const std::string out = w.sample(rng);
      const nlohmann::json doc = nlohmann::json::parse(out, nullptr, false);
      ASSERT_TRUE(doc.is_array()) << k.schema << " wrote " << out;
      EXPECT_EQ(doc.size(), k.size) << k.schema << " wrote " << out;
      EXPECT_TRUE(all_distinct(doc)) << k.schema << " wrote " << out;
    }
  }
}

// Random documents of open domains, nested distinct arrays among them.
TEST(DistinctItems, SampledDocumentsHaveDistinctItems) {
  const auto m = schema(R"({"type": "object", "required": ["tags", "grid"], "additionalProperties": false,
    "properties": {
      "tags": {"type": "array", "uniqueItems": true, "minItems": 4, "maxItems": 6,
               "items": {"type": "string", "maxLength": 2}},
      "grid": {"type": "array", "uniqueItems": true, "minItems": 3, "maxItems": 3,
               "items": {"type": "array", "uniqueItems": true, "minItems": 2, "maxItems": 2,
                         "items": {"type": "integer", "minimum": 0, "maximum": 2}}}}})");
  for (uint32_t seed = 0; seed < 30; ++seed) {
    std::mt19937 rng(seed);
    Walk w(m);
    const std::string out = w.sample(rng, 2000);
    const nlohmann::json doc = nlohmann::json::parse(out, nullptr, false);
    ASSERT_TRUE(doc.is_object()) << out;
    EXPECT_TRUE(all_distinct(doc["tags"])) << out;
    EXPECT_TRUE(all_distinct(doc["grid"])) << out;
    for (const auto& row : doc["grid"]) EXPECT_TRUE(all_distinct(row)) << out;
  }
}

// The text around a distinct rule need not be JSON; only the container the
// rule opens is tracked (a bracket in the tag before it is not).
TEST(DistinctItems, ADistinctRuleInsideOtherText) {
  Walk w(masker_for({StructuredOutputSpec::Kind::kGrammar, R"(
      root ::= "[x] <" distinct..digits ">"
      distinct..digits ::= "[" [0-9] ("," [0-9])* "]")"}));
  w.write("[x] <[1,2");
  EXPECT_TRUE(w.allows(","));
  w.write(",");
  EXPECT_FALSE(w.allows("1"));
  EXPECT_FALSE(w.allows("2"));
  EXPECT_TRUE(w.allows("3"));
}

// Member names: a distinct rule that writes an object writes no name
// twice, compared as strings, in nested objects apart; a finite set of
// names runs out without a dead end. (JSON Schema objects do not use this
// yet: see the note in grammar/distinct_json.h.)
TEST(DistinctItems, MemberNamesAreNotWrittenTwice) {
  {
    Walk w(masker_for({StructuredOutputSpec::Kind::kGrammar, R"(
        root ::= distinct..open..object
        distinct..open..object ::= "{" (member ("," member)*)? "}"
        member ::= "\"" [a-z]+ "\":" ([0-9] | distinct..open..object))"}));
    w.write(R"({"a":1,"b":{"a":2,"a)");
    EXPECT_FALSE(w.allows("\""));  // the inner object has "a" already
    EXPECT_TRUE(w.allows("b"));
    w.write(R"(b":3},"a)");
    EXPECT_FALSE(w.allows("\""));  // nor may the outer one take "a" again
    w.write(R"(c":4})");
  }
  const auto m = masker_for({StructuredOutputSpec::Kind::kGrammar, R"(
      root ::= distinct..names
      distinct..names ::= "{" member "," member "," member "}"
      member ::= "\"" [abc] "\":1")"});
  for (uint32_t seed = 0; seed < 30; ++seed) {
    std::mt19937 rng(seed);
    Walk w(m);
    const std::string out = w.sample(rng);
    const nlohmann::json doc = nlohmann::json::parse(out, nullptr, false);
    ASSERT_TRUE(doc.is_object()) << out;
    EXPECT_EQ(doc.size(), 3u) << out;  // nlohmann keeps one of a repeated name
  }
}

// A translation whose rules carry a prefix (tool calls combine several)
// keeps its distinct rules.
TEST(DistinctItems, PrefixedRulesStayDistinct) {
  Walk w(masker_for({StructuredOutputSpec::Kind::kGrammar, R"(
      root ::= fn3.distinct..open..digits
      fn3.distinct..open..digits ::= "[" [0-9] ("," [0-9])* "]")"}));
  w.write("[1,2,");
  EXPECT_FALSE(w.allows("1"));
  EXPECT_TRUE(w.allows("3"));
}

TEST(DistinctItems, RollbackForgetsTheItems) {
  Walk w(schema(R"({"type": "array", "items": {"type": "string"}, "uniqueItems": true})"));
  w.write(R"(["a",)");
  const std::vector<uint32_t> before = w.mask();
  w.write(R"("b",)");
  EXPECT_FALSE(w.allows(R"("a")"));  // a whole item in one token
  EXPECT_TRUE(w.allows(R"("a)"));    // "ab" is new
  w.write(R"("b)");
  EXPECT_FALSE(w.allows(R"(")"));
  w.c.rollback(6);
  EXPECT_EQ(w.mask(), before);
  w.write(R"("b)");
  EXPECT_TRUE(w.allows(R"(")"));
  // Whole tokens with several pieces (a bracket cuts a token in two) roll
  // back as one.
  Walk t(schema(R"({"type": "array", "items": {"type": "array"}, "uniqueItems": true})"));
  const std::vector<uint32_t> start = t.mask();
  t.c.accept(t.masker->vocabulary().spelled("[[")[0]);
  t.c.rollback(1);
  EXPECT_EQ(t.mask(), start);
}

// Where the items plainly take fewer values than minItems, the translation
// says no array satisfies the schema. Where that is not plain (a pattern's
// strings), the masks are the grammar's where nothing else is left: never
// an empty one.
TEST(DistinctItems, AnImpossibleArrayIsRefusedOrStillEnds) {
  for (const char* impossible : {
           R"({"type": "array", "uniqueItems": true, "minItems": 2, "items": {"const": 1}})",
           R"({"type": "array", "uniqueItems": true, "minItems": 3, "items": {"enum": ["a", "b", "a"]}})",
           R"({"type": "array", "uniqueItems": true, "minItems": 3, "items": {"type": "boolean"}})",
           R"({"type": "array", "uniqueItems": true, "minItems": 4, "items": {"type": "integer", "minimum": 1,
               "maximum": 3}})"}) {
    try {
      to_ebnf({StructuredOutputSpec::Kind::kJsonSchema, impossible});
      ADD_FAILURE() << "translated " << impossible;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("distinct values, fewer than minItems"), std::string::npos) << e.what();
    }
  }
  Walk w(schema(R"({"type": "array", "uniqueItems": true, "minItems": 2, "maxItems": 2,
                    "items": {"type": "string", "pattern": "^a$"}})"));
  std::mt19937 rng(1);
  EXPECT_EQ(w.sample(rng), R"(["a","a"])");
}

TEST(DistinctItems, UniqueItemsMustBeABoolean) {
  EXPECT_THROW(to_ebnf({StructuredOutputSpec::Kind::kJsonSchema, R"({"type": "array", "uniqueItems": 1})"}), Error);
  // allOf: one side asking is enough.
  EXPECT_NE(to_ebnf({StructuredOutputSpec::Kind::kJsonSchema,
                     R"({"allOf": [{"type": "array"}, {"uniqueItems": true}, {"uniqueItems": false}]})"})
                .find(kDistinctRulePrefix),
            std::string::npos);
}

}  // namespace
}  // namespace basalt

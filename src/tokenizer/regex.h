// Regex: the regular expressions that tokenizer.json files use to split text.
//
// Contract: compile() accepts the Oniguruma (Ruby syntax) subset that
// published pre-tokenizers use: literals, '.', alternation, groups '(...)',
// '(?:...)', '(?i:...)', '(?i)', lookahead '(?=...)' and '(?!...)', classes
// with ranges, negation and escapes, \p{..}/\P{..} general categories, \s \S
// \d \D \w \W (Unicode meanings, \s being White_Space), \r \n \t \f \v \e
// \xHH \x{H..} \uHHHH, anchors ^ $ (line) and \A \z, and greedy or lazy
// quantifiers * + ? {n} {n,} {n,m}. Anything else (backreferences,
// lookbehind, nested classes, possessive quantifiers, scripts) throws
// basalt::Error naming the pattern and the offending position, so an
// unsupported tokenizer fails at load time instead of splitting differently.
//
// Matching is backtracking with leftmost-first alternation, which is what
// Oniguruma does, and find_all() reports non-overlapping matches exactly as
// the `onig` crate's find_iter (an empty match right after the previous match
// is skipped). Offsets are byte offsets into the UTF-8 text. A compiled Regex
// is immutable and safe to share between threads.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace basalt {

class Regex {
 public:
  struct Span {
    size_t begin = 0;  // byte offsets, [begin, end)
    size_t end = 0;
    bool operator==(const Span&) const = default;
  };

  // Throws basalt::Error for syntax errors and unsupported constructs.
  static Regex compile(std::string_view pattern);
  // A pattern that matches `literal` exactly (like Rust's regex::escape).
  static Regex literal(std::string_view literal);

  // The leftmost match that starts at or after byte offset `from`.
  std::optional<Span> find(std::string_view text, size_t from = 0) const;
  // Every non-overlapping match, left to right.
  std::vector<Span> find_all(std::string_view text) const;

  const std::string& pattern() const;

  struct Program;  // compiled form, defined in regex.cc

 private:
  explicit Regex(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;
};

}  // namespace basalt

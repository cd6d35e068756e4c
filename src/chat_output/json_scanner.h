// JsonScanner: JSON syntax (RFC 8259) checked one byte at a time, for one
// object or array, so that a parser reading a model's output as it streams
// knows where a JSON value ends (braces inside strings included) and learns
// that it is malformed at its first bad byte rather than at the end of the
// output.
//
// Contract: step() reports whether the bytes so far can still become such a
// value (kMore), just became one (kDone, on its closing byte) or never can
// (kError, on the first byte that rules it out; the scanner is then spent).
// Strings are checked for escapes and control characters, not for UTF-8
// (whoever parses the value checks that). Nesting deeper than kMaxDepth is
// an error, so that no later recursive walk over the value runs out of
// stack. A default-constructed scanner starts a new value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace basalt {

class JsonScanner {
 public:
  enum class Status { kMore, kDone, kError };
  static constexpr size_t kMaxDepth = 512;

  Status step(char c);

 private:
  enum class S : uint8_t {
    kValue,
    kObjectFirst,
    kObjectKey,
    kColon,
    kArrayFirst,
    kAfterValue,
    kString,
    kEscape,
    kUnicode,
    kLiteral,
    kMinus,
    kZero,
    kInteger,
    kDot,
    kFraction,
    kE,
    kExponentSign,
    kExponent,
    kDone,
  };

  Status value(char c);
  Status digit_or_error(char c, S next);
  Status number_end(char c, bool in_fraction);
  Status after_value(char c);
  Status close();
  Status ended();

  S state_ = S::kValue;
  std::string stack_;  // the open containers, '{' or '['
  bool in_key_ = false;
  int hex_left_ = 0;
  std::string_view literal_;  // the rest of true, false or null
};

}  // namespace basalt

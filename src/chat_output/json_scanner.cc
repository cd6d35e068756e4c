#include "chat_output/json_scanner.h"

namespace basalt {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

JsonScanner::Status JsonScanner::step(char c) {
  switch (state_) {
    case S::kValue:
      return value(c);
    case S::kObjectFirst:
      if (is_space(c)) return Status::kMore;
      if (c == '}') return close();
      [[fallthrough]];
    case S::kObjectKey:
      if (is_space(c)) return Status::kMore;
      if (c != '"') return Status::kError;
      state_ = S::kString;
      in_key_ = true;
      return Status::kMore;
    case S::kColon:
      if (is_space(c)) return Status::kMore;
      if (c != ':') return Status::kError;
      state_ = S::kValue;
      return Status::kMore;
    case S::kArrayFirst:
      if (is_space(c)) return Status::kMore;
      if (c == ']') return close();
      return value(c);
    case S::kAfterValue:
      return after_value(c);
    case S::kString:
      if (c == '"') {
        if (!in_key_) return ended();
        in_key_ = false;
        state_ = S::kColon;
        return Status::kMore;
      }
      if (c == '\\') state_ = S::kEscape;
      return static_cast<unsigned char>(c) < 0x20 ? Status::kError : Status::kMore;
    case S::kEscape:
      if (c == 'u') {
        state_ = S::kUnicode;
        hex_left_ = 4;
        return Status::kMore;
      }
      state_ = S::kString;
      return std::string_view("\"\\/bfnrt").find(c) == std::string_view::npos ? Status::kError : Status::kMore;
    case S::kUnicode:
      if (!is_hex(c)) return Status::kError;
      if (--hex_left_ == 0) state_ = S::kString;
      return Status::kMore;
    case S::kLiteral:
      if (c != literal_[0]) return Status::kError;
      literal_.remove_prefix(1);
      return literal_.empty() ? ended() : Status::kMore;
    case S::kMinus:
      return digit_or_error(c, c == '0' ? S::kZero : S::kInteger);
    case S::kZero:
      return number_end(c, false);
    case S::kInteger:
      return is_digit(c) ? Status::kMore : number_end(c, false);
    case S::kDot:
      return digit_or_error(c, S::kFraction);
    case S::kFraction:
      return is_digit(c) ? Status::kMore : number_end(c, true);
    case S::kE:
      if (c == '+' || c == '-') {
        state_ = S::kExponentSign;
        return Status::kMore;
      }
      return digit_or_error(c, S::kExponent);
    case S::kExponentSign:
      return digit_or_error(c, S::kExponent);
    case S::kExponent:
      return is_digit(c) ? Status::kMore : after_value(c);
    case S::kDone:
      return Status::kError;
  }
  return Status::kError;
}

JsonScanner::Status JsonScanner::value(char c) {
  if (is_space(c) && !stack_.empty()) return Status::kMore;
  if (c == '{' || c == '[') {
    if (stack_.size() >= kMaxDepth) return Status::kError;
    stack_.push_back(c);
    state_ = c == '{' ? S::kObjectFirst : S::kArrayFirst;
    return Status::kMore;
  }
  if (stack_.empty()) return Status::kError;  // the value itself is an object or array
  if (c == '"') {
    state_ = S::kString;
    return Status::kMore;
  }
  if (c == '-') {
    state_ = S::kMinus;
    return Status::kMore;
  }
  if (is_digit(c)) {
    state_ = c == '0' ? S::kZero : S::kInteger;
    return Status::kMore;
  }
  literal_ = c == 't' ? "rue" : c == 'f' ? "alse" : c == 'n' ? "ull" : "";
  if (literal_.empty()) return Status::kError;
  state_ = S::kLiteral;
  return Status::kMore;
}

JsonScanner::Status JsonScanner::digit_or_error(char c, S next) {
  if (!is_digit(c)) return Status::kError;
  state_ = next;
  return Status::kMore;
}

// After the integer part (or the fraction): a fraction, an exponent, or the
// number has ended before `c`.
JsonScanner::Status JsonScanner::number_end(char c, bool in_fraction) {
  if (c == '.' && !in_fraction) {
    state_ = S::kDot;
    return Status::kMore;
  }
  if (c == 'e' || c == 'E') {
    state_ = S::kE;
    return Status::kMore;
  }
  return after_value(c);
}

// A value inside a container ended before `c`.
JsonScanner::Status JsonScanner::after_value(char c) {
  state_ = S::kAfterValue;
  if (is_space(c)) return Status::kMore;
  if (c == ',') {
    state_ = stack_.back() == '{' ? S::kObjectKey : S::kValue;
    return Status::kMore;
  }
  if ((c == '}' && stack_.back() == '{') || (c == ']' && stack_.back() == '[')) return close();
  return Status::kError;
}

JsonScanner::Status JsonScanner::close() {
  stack_.pop_back();
  return ended();
}

// A value ended on this byte.
JsonScanner::Status JsonScanner::ended() {
  state_ = stack_.empty() ? S::kDone : S::kAfterValue;
  return stack_.empty() ? Status::kDone : Status::kMore;
}

}  // namespace basalt

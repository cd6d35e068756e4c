#include "chat_output/reasoning_parser.h"

#include <algorithm>

#include "core/error.h"

namespace basalt {
namespace {

constexpr std::string_view kOpenTag = "<think>";
constexpr std::string_view kCloseTag = "</think>";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The length of the longest tail of `text` that `tag` starts with (shorter
// than the tag itself).
size_t partial_tag_tail(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(tag.size() - 1, text.size()); n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace

std::string_view to_string(ReasoningFormat format) {
  return format == ReasoningFormat::kDeepSeekR1 ? "deepseek_r1" : "qwen3";
}

ReasoningFormat parse_reasoning_format(std::string_view name) {
  if (name == "deepseek_r1") return ReasoningFormat::kDeepSeekR1;
  if (name == "qwen3") return ReasoningFormat::kQwen3;
  fail("unknown reasoning format \"{}\" (known: deepseek_r1, qwen3)", name);
}

bool prompt_opens_reasoning(std::string_view prompt_text) {
  while (!prompt_text.empty() && is_space(prompt_text.back())) prompt_text.remove_suffix(1);
  return prompt_text.ends_with(kOpenTag);
}

ReasoningParser::ReasoningParser(ReasoningFormat format, bool starts_in_reasoning)
    : without_open_tag_(format == ReasoningFormat::kDeepSeekR1 || starts_in_reasoning ? Phase::kReasoning
                                                                                      : Phase::kContent) {}

ReasoningDelta ReasoningParser::feed(std::string_view text) {
  ReasoningDelta out;
  if (finished_) {
    out.content.append(text);
    return out;
  }
  held_.append(text);
  run(false, out);
  return out;
}

ReasoningDelta ReasoningParser::finish() {
  ReasoningDelta out;
  if (!finished_) run(true, out);
  finished_ = true;
  return out;
}

void ReasoningParser::run(bool final, ReasoningDelta& out) {
  if (phase_ == Phase::kOpening) {
    size_t p = 0;
    while (p < held_.size() && is_space(held_[p])) ++p;
    const std::string_view rest = std::string_view(held_).substr(p);
    if (rest.starts_with(kOpenTag)) {
      held_.erase(0, p + kOpenTag.size());
      phase_ = Phase::kReasoning;
    } else if (!final && kOpenTag.starts_with(rest) && p <= kMaxLeadingSpace) {
      return;  // whitespace, then maybe the start of <think>
    } else {
      phase_ = without_open_tag_;
    }
  }
  if (phase_ == Phase::kReasoning) {
    const size_t close = held_.find(kCloseTag);
    if (close == std::string::npos) {
      const size_t keep = final ? 0 : partial_tag_tail(held_, kCloseTag);
      out.reasoning.append(held_, 0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return;
    }
    out.reasoning.append(held_, 0, close);
    held_.erase(0, close + kCloseTag.size());
    phase_ = Phase::kContent;
  }
  out.content += held_;
  held_.clear();
}

}  // namespace basalt

// ReasoningParser: splits a reasoning model's output text, as it streams,
// into its reasoning (OpenAI-compatible servers' `reasoning_content`) and
// its content, by the <think> ... </think> tags the model writes.
//
//   kDeepSeekR1  DeepSeek R1 and its distillations, QwQ: the output starts
//                in reasoning, whether or not it writes <think> first (R1
//                does not; R1-0528 does; the prompt may have opened it), and
//                everything up to </think> is reasoning, the rest content.
//                An output that never writes </think> is all reasoning (cut
//                off while thinking), as vLLM's deepseek_r1 parser decides.
//                starts_in_reasoning changes nothing for it.
//   kQwen3       Qwen3 (with enable_thinking): reasoning only inside a
//                <think> ... </think> block that opens the output, or that
//                the prompt opened (starts_in_reasoning); an output without
//                the open tag, when the prompt did not open one, is all
//                content. Once open, a block that never closes is all
//                reasoning: what was given out as reasoning is not taken back.
//
// Contract: the tags are removed (a <think> only where it opens the output,
// after optional whitespace, which goes with it; the first </think> after
// that); every other byte goes to exactly one of reasoning and content, in
// order. Text that may be the start of a tag (a trailing "</thi") is held
// back until decided, then released to the side it belongs to; other text
// goes out at once. Held text starts at a '<' or at the output's start, so
// no UTF-8 code point the caller gave whole is cut. feed() takes the text
// in chunks of any size (any split gives the same result); finish() marks
// the end and releases what is held. Nothing here throws.
#pragma once

#include <string>
#include <string_view>

namespace basalt {

enum class ReasoningFormat { kDeepSeekR1, kQwen3 };

// vLLM's --reasoning-parser name: "deepseek_r1", "qwen3".
std::string_view to_string(ReasoningFormat format);
// Throws basalt::Error for an unknown name, listing the known ones.
ReasoningFormat parse_reasoning_format(std::string_view name);

// Whether a rendered prompt leaves the model inside a reasoning block: it
// ends with "<think>", possibly followed by whitespace (a newline).
bool prompt_opens_reasoning(std::string_view prompt_text);

struct ReasoningDelta {
  std::string reasoning, content;
};

class ReasoningParser {
 public:
  // The most leading whitespace held while waiting to see whether <think> follows.
  static constexpr size_t kMaxLeadingSpace = 4096;

  // starts_in_reasoning: the prompt already opened the reasoning block
  // (prompt_opens_reasoning()).
  ReasoningParser(ReasoningFormat format, bool starts_in_reasoning);

  ReasoningDelta feed(std::string_view text);
  ReasoningDelta finish();
  // The reasoning is over: the rest of the output is content.
  bool in_content() const { return phase_ == Phase::kContent; }

 private:
  enum class Phase { kOpening, kReasoning, kContent };

  void run(bool final, ReasoningDelta& out);

  Phase phase_ = Phase::kOpening;
  // Where the output goes when it does not open with <think>.
  Phase without_open_tag_;
  std::string held_;
  bool finished_ = false;
};

}  // namespace basalt

// ReasoningParser: where reasoning ends and content begins for each format,
// with and without the open tag, cut off, and fed in every way.
#include "chat_output/reasoning_parser.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "testing/error_test_util.h"

namespace basalt {
namespace {

ReasoningDelta run(ReasoningFormat format, bool starts_in_reasoning, const std::vector<std::string>& chunks) {
  ReasoningParser parser(format, starts_in_reasoning);
  ReasoningDelta total;
  const auto take = [&](const ReasoningDelta& d) {
    total.reasoning += d.reasoning;
    total.content += d.content;
  };
  for (const std::string& chunk : chunks) take(parser.feed(chunk));
  take(parser.finish());
  return total;
}

// Whole, byte by byte and in random chunks: the same every way.
void expect_split(ReasoningFormat format, bool starts_in_reasoning, const std::string& output,
                  const std::string& reasoning, const std::string& content) {
  const ReasoningDelta whole = run(format, starts_in_reasoning, {output});
  EXPECT_EQ(whole.reasoning, reasoning) << output;
  EXPECT_EQ(whole.content, content) << output;
  std::vector<std::string> bytes;
  for (const char c : output) bytes.emplace_back(1, c);
  const ReasoningDelta by_byte = run(format, starts_in_reasoning, bytes);
  EXPECT_EQ(by_byte.reasoning, reasoning) << "byte by byte: " << output;
  EXPECT_EQ(by_byte.content, content) << "byte by byte: " << output;
  std::mt19937 rng(static_cast<uint32_t>(output.size()));
  for (int trial = 0; trial < 8; ++trial) {
    std::vector<std::string> chunks;
    for (size_t i = 0; i < output.size();) {
      const size_t n = std::uniform_int_distribution<size_t>(1, 9)(rng);
      chunks.push_back(output.substr(i, n));
      i += n;
    }
    const ReasoningDelta chunked = run(format, starts_in_reasoning, chunks);
    EXPECT_EQ(chunked.reasoning, reasoning) << "in chunks: " << output;
    EXPECT_EQ(chunked.content, content) << "in chunks: " << output;
  }
}

TEST(ReasoningParser, NamesAndPromptCheck) {
  EXPECT_EQ(parse_reasoning_format("deepseek_r1"), ReasoningFormat::kDeepSeekR1);
  EXPECT_EQ(parse_reasoning_format(to_string(ReasoningFormat::kQwen3)), ReasoningFormat::kQwen3);
  EXPECT_CONTAINS(testing::error_of([] { parse_reasoning_format("granite"); }), "deepseek_r1, qwen3");
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<｜Assistant｜><think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
  EXPECT_FALSE(prompt_opens_reasoning(""));
}

TEST(ReasoningParser, DeepSeekR1) {
  const ReasoningFormat f = ReasoningFormat::kDeepSeekR1;
  for (const bool opened : {false, true}) {
    // With and without the open tag (R1-0528 writes it, R1 does not).
    expect_split(f, opened, "<think>\nLet me think. 2+2=4.\n</think>\n\nThe answer is 4.", "\nLet me think. 2+2=4.\n",
                 "\n\nThe answer is 4.");
    expect_split(f, opened, "\n<think>x</think>y", "x", "y");
    expect_split(f, opened, "Let me think: is 1 < 2? Yes </thinking> </think>It is.",
                 "Let me think: is 1 < 2? Yes "
                 "</thinking> ",
                 "It is.");
    // Never closed: all reasoning, and tag-like text at the end is released.
    expect_split(f, opened, "Hmm, 思考中 🤔 </thi", "Hmm, 思考中 🤔 </thi", "");
    expect_split(f, opened, "", "", "");
    // Only the first </think> ends it; <think> later on is text.
    expect_split(f, opened, "a</think>b <think>c</think>", "a", "b <think>c</think>");
    expect_split(f, opened, "</think>", "", "");
  }
}

TEST(ReasoningParser, Qwen3) {
  const ReasoningFormat f = ReasoningFormat::kQwen3;
  expect_split(f, false, "<think>\nok\n</think>\n\nHello!", "\nok\n", "\n\nHello!");
  expect_split(f, false, "  <think>a</think>b", "a", "b");
  // No open tag and none in the prompt: all content, tags included.
  expect_split(f, false, "Hello! </think> <think>", "", "Hello! </think> <think>");
  expect_split(f, false, "\n\nHi", "", "\n\nHi");
  expect_split(f, false, "<thin", "", "<thin");
  // The prompt opened the block.
  expect_split(f, true, "ok, so...\n</think>\n\nHello!", "ok, so...\n", "\n\nHello!");
  expect_split(f, true, "<think>again</think>x", "again", "x");
  expect_split(f, true, "cut off while thinking <", "cut off while thinking <", "");
  // Opened by the output but never closed: reasoning.
  expect_split(f, false, "<think>still thinking", "still thinking", "");
}

TEST(ReasoningParser, TextGoesOutAtOnceAndPartialTagsAreHeld) {
  ReasoningParser parser(ReasoningFormat::kQwen3, /*starts_in_reasoning=*/true);
  EXPECT_EQ(parser.feed("thinking").reasoning, "thinking");
  ReasoningDelta d = parser.feed(" more </th");
  EXPECT_EQ(d.reasoning, " more ");
  d = parser.feed("ink>Answer");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Answer");
  EXPECT_EQ(parser.feed(" </think>").content, " </think>");
  EXPECT_EQ(parser.finish().content, "");

  ReasoningParser plain(ReasoningFormat::kQwen3, false);
  EXPECT_EQ(plain.feed("\n").content, "");  // maybe <think> follows
  EXPECT_EQ(plain.feed("Hi").content, "\nHi");
  // Leading whitespace is not held without bound.
  ReasoningParser spaces(ReasoningFormat::kQwen3, false);
  EXPECT_EQ(spaces.feed(std::string(ReasoningParser::kMaxLeadingSpace + 1, ' ')).content.size(),
            ReasoningParser::kMaxLeadingSpace + 1);
}

}  // namespace
}  // namespace basalt

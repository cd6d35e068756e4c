#include "loadgen/sse.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace basalt::loadgen {
namespace {

std::vector<std::string> parse_in_pieces(const std::string& body, const std::vector<size_t>& cuts) {
  std::vector<std::string> events;
  SseParser p([&events](std::string_view d) { events.emplace_back(d); });
  size_t at = 0;
  for (size_t cut : cuts) {
    EXPECT_TRUE(p.feed(std::string_view(body).substr(at, cut - at)));
    at = cut;
  }
  EXPECT_TRUE(p.feed(std::string_view(body).substr(at)));
  p.finish();
  return events;
}

const std::string kStream =
    "data: {\"choices\":[{\"text\":\"Hello\"}]}\n\n"
    ": a comment\r\n"
    "event: message\r\n"
    "data: {\"choices\":[{\"text\":\" wor\\u00e9ld\"}]}\r\n\r\n"
    "id: 7\rdata:first\rdata: second\r\r"
    "retry: 10\n"
    "data: [DONE]\n\n";

const std::vector<std::string> kEvents = {"{\"choices\":[{\"text\":\"Hello\"}]}",
                                          "{\"choices\":[{\"text\":\" wor\\u00e9ld\"}]}", "first\nsecond", "[DONE]"};

TEST(SseParser, ParsesWholeBody) { EXPECT_EQ(parse_in_pieces(kStream, {}), kEvents); }

TEST(SseParser, SameEventsForEverySingleSplit) {
  for (size_t cut = 0; cut <= kStream.size(); ++cut) EXPECT_EQ(parse_in_pieces(kStream, {cut}), kEvents) << cut;
}

TEST(SseParser, SameEventsByteByByteAndRandomSplits) {
  std::vector<size_t> every;
  for (size_t i = 1; i < kStream.size(); ++i) every.push_back(i);
  EXPECT_EQ(parse_in_pieces(kStream, every), kEvents);
  std::mt19937 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<size_t> cuts;
    for (size_t i = 1; i < kStream.size(); ++i)
      if (rng() % 5 == 0) cuts.push_back(i);
    EXPECT_EQ(parse_in_pieces(kStream, cuts), kEvents);
  }
}

TEST(SseParser, CrlfSplitBetweenCrAndLfIsOneLineEnd) {
  // "\r" then "\n" in separate pieces must not make an extra blank line.
  const std::string body = "data: a\r\ndata: b\r\n\r\n";
  EXPECT_EQ(parse_in_pieces(body, {8}), (std::vector<std::string>{"a\nb"}));
  EXPECT_EQ(parse_in_pieces(body, {17}), (std::vector<std::string>{"a\nb"}));
}

TEST(SseParser, FinishReportsAnUnterminatedEvent) {
  EXPECT_EQ(parse_in_pieces("data: tail", {}), (std::vector<std::string>{"tail"}));
  EXPECT_EQ(parse_in_pieces("data: x\n", {}), (std::vector<std::string>{"x"}));
  EXPECT_TRUE(parse_in_pieces(": only a comment\n\n", {}).empty());
  EXPECT_EQ(parse_in_pieces("data\n\n", {}), (std::vector<std::string>{""}));
}

TEST(SseParser, OverlongLineFailsAndStaysFailed) {
  int events = 0;
  SseParser p([&events](std::string_view) { ++events; }, 16);
  EXPECT_TRUE(p.feed("data: 0123456789"));
  EXPECT_FALSE(p.feed("abcdef"));
  EXPECT_FALSE(p.error().empty());
  EXPECT_FALSE(p.feed("\n\n"));
  p.finish();
  EXPECT_EQ(events, 0);
}

TEST(ReadChunk, CompletionAndChatTokens) {
  ChunkInfo c = read_chunk(R"({"choices":[{"index":0,"text":"ab","finish_reason":null}],"usage":null})");
  EXPECT_EQ(c.kind, ChunkInfo::Kind::kToken);
  EXPECT_EQ(c.text, "ab");
  EXPECT_EQ(c.usage_completion_tokens, -1);
  c = read_chunk(R"({"choices":[{"index":0,"delta":{"content":"x"}}]})");
  EXPECT_EQ(c.kind, ChunkInfo::Kind::kToken);
  c = read_chunk(R"({"choices":[{"index":0,"delta":{"content":null,"reasoning_content":"think"}}]})");
  EXPECT_EQ(c.kind, ChunkInfo::Kind::kToken);
  EXPECT_EQ(c.text, "think");
}

TEST(ReadChunk, NonTokenEvents) {
  EXPECT_EQ(read_chunk(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})").kind, ChunkInfo::Kind::kOther);
  EXPECT_EQ(read_chunk(R"({"choices":[{"text":"","finish_reason":"length"}]})").kind, ChunkInfo::Kind::kOther);
  EXPECT_EQ(read_chunk(R"({"choices":[{"delta":{},"finish_reason":"stop"}]})").kind, ChunkInfo::Kind::kOther);
  EXPECT_EQ(read_chunk("[DONE]").kind, ChunkInfo::Kind::kDone);
  const ChunkInfo u = read_chunk(R"({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":12}})");
  EXPECT_EQ(u.kind, ChunkInfo::Kind::kOther);
  EXPECT_EQ(u.usage_completion_tokens, 12);
  EXPECT_EQ(u.usage_prompt_tokens, 5);
  const ChunkInfo e = read_chunk(R"({"error":{"message":"engine failed","code":500}})");
  EXPECT_EQ(e.kind, ChunkInfo::Kind::kError);
  EXPECT_EQ(e.text, "engine failed");
}

TEST(ReadChunk, MalformedEventsNeverThrow) {
  for (const char* bad : {"not json", "{\"choices\":", "[1,2]", "42", R"({"choices":{}})", R"({"choices":[1]})",
                          R"({"choices":[{"text":5}]})", R"({"choices":[{"delta":"x"}]})",
                          R"({"choices":[{"delta":{"content":[1]}}]})", R"({"usage":"many"})",
                          R"({"usage":{"completion_tokens":-3}})", R"({"usage":{"completion_tokens":"7"}})", ""}) {
    const ChunkInfo c = read_chunk(bad);
    EXPECT_EQ(c.kind, ChunkInfo::Kind::kMalformed) << bad;
    EXPECT_FALSE(c.text.empty()) << bad;
  }
}

}  // namespace
}  // namespace basalt::loadgen

#include "loadgen/chunk.h"

#include <gtest/gtest.h>

namespace basalt::loadgen {
namespace {

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

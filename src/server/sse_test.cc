// SseParser: the same events, raw bytes and comments whatever pieces the
// body comes in.
#include "server/sse.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace basalt {
namespace {

// Feeds `body` cut at `cuts` (ascending), then finishes.
void feed_in_pieces(SseParser& p, const std::string& body, const std::vector<size_t>& cuts) {
  size_t at = 0;
  for (size_t cut : cuts) {
    EXPECT_TRUE(p.feed(std::string_view(body).substr(at, cut - at)));
    at = cut;
  }
  EXPECT_TRUE(p.feed(std::string_view(body).substr(at)));
  p.finish();
}

std::vector<std::string> parse_in_pieces(const std::string& body, const std::vector<size_t>& cuts) {
  std::vector<std::string> events;
  SseParser p([&events](std::string_view d) { events.emplace_back(d); });
  feed_in_pieces(p, body, cuts);
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

// Every callback's output for a body fed in pieces: data events, raw
// events and comments, in order, each marked.
std::vector<std::string> everything_in_pieces(const std::string& body, const std::vector<size_t>& cuts) {
  std::vector<std::string> out;
  SseParser p([&out](std::string_view d) { out.push_back("data " + std::string(d)); });
  p.on_raw([&out](std::string_view r) { out.push_back("raw " + std::string(r)); });
  p.on_comment([&out](std::string_view c) { out.push_back("comment " + std::string(c)); });
  feed_in_pieces(p, body, cuts);
  return out;
}

TEST(SseParser, RawEventsAreTheFieldLinesAsReceivedAndCommentsGoApart) {
  const std::vector<std::string> expected = {
      "raw data: {\"choices\":[{\"text\":\"Hello\"}]}\n\n",
      "data {\"choices\":[{\"text\":\"Hello\"}]}",
      "comment  a comment",
      "raw event: message\r\ndata: {\"choices\":[{\"text\":\" wor\\u00e9ld\"}]}\r\n\r\n",
      "data {\"choices\":[{\"text\":\" wor\\u00e9ld\"}]}",
      "raw id: 7\rdata:first\rdata: second\r\r",
      "data first\nsecond",
      "raw retry: 10\ndata: [DONE]\n\n",
      "data [DONE]",
  };
  EXPECT_EQ(everything_in_pieces(kStream, {}), expected);
  // Every split gives the same, but for the one between the "\r" and "\n"
  // of the blank line after the second event: that event is out at the
  // "\r".
  const size_t second_blank_lf = kStream.find("\r\n\r\n") + 3;
  for (size_t cut = 0; cut <= kStream.size(); ++cut) {
    std::vector<std::string> want = expected;
    if (cut == second_blank_lf) want[3].pop_back();
    EXPECT_EQ(everything_in_pieces(kStream, {cut}), want) << cut;
  }
  std::vector<size_t> every;
  for (size_t i = 1; i < kStream.size(); ++i) every.push_back(i);
  std::vector<std::string> byte_by_byte = expected;
  byte_by_byte[3].pop_back();
  EXPECT_EQ(everything_in_pieces(kStream, every), byte_by_byte);
}

TEST(SseParser, RawSkipsCommentOnlyBlocksAndUnclosedEvents) {
  // A heartbeat comment alone is no event; an event cut off by the end of
  // the body reaches on_event (finish) but not on_raw (not complete).
  EXPECT_EQ(everything_in_pieces(": ping\n\nevent: x\n\ndata: tail", {}),
            (std::vector<std::string>{"comment  ping", "raw event: x\n\n", "data tail"}));
}

TEST(SseParser, AnOverlongEventFails) {
  SseParser p([](std::string_view) {}, 32);
  p.on_raw([](std::string_view) {});
  EXPECT_TRUE(p.feed("data: 0123456789\n"));
  EXPECT_FALSE(p.feed("data: 0123456789\n"));
  EXPECT_NE(p.error().find("event"), std::string::npos);
}

}  // namespace
}  // namespace basalt

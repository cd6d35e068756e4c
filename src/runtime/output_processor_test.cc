// OutputProcessor: the client side's text of a request's token ids, with the
// generator's rules: the texts add up to the decoded output, a stop string
// ends the stream at once (and says how many tokens were kept), held-back
// text comes out at the end, eos and stop ids carry no text unless asked.
#include "runtime/output_processor.h"

#include <gtest/gtest.h>

#include <deque>
#include <string>
#include <vector>

namespace basalt {
namespace {

const std::string kModel = std::string(BASALT_TESTDATA) + "/../models/basalt-mini";

RequestUpdate token(int32_t id, bool stop_token = false) {
  RequestUpdate u;
  u.token = id;
  u.stop_token = stop_token;
  u.usage.prompt_tokens = 3;
  return u;
}

RequestUpdate finished(FinishReason reason) {
  RequestUpdate u;
  u.finished = true;
  u.reason = reason;
  return u;
}

struct Events {
  std::deque<EngineEvent> events;
  std::string text() const {
    std::string t;
    for (const EngineEvent& e : events) t += e.text;
    return t;
  }
  int tokens() const {
    int n = 0;
    for (const EngineEvent& e : events) n += e.kind == EngineEvent::Kind::kToken ? 1 : 0;
    return n;
  }
};

class OutputProcessorTest : public ::testing::Test {
 protected:
  void SetUp() override { tokenizer_ = load_tokenizer_dir(kModel).tokenizer; }
  std::vector<int32_t> encode(const std::string& s) const { return tokenizer_->encode(s, false); }
  std::optional<Tokenizer> tokenizer_;
};

TEST_F(OutputProcessorTest, TextsAddUpToTheDecodedOutput) {
  const std::vector<int32_t> ids = encode("The Debian project makes a free operating system.");
  SamplingParams p;
  OutputProcessor proc(&*tokenizer_, p, 42);
  Events run;
  for (int32_t id : ids) proc.process(token(id), run.events);
  proc.process(finished(FinishReason::kLength), run.events);
  EXPECT_EQ(run.text(), tokenizer_->decode(ids, true));
  EXPECT_EQ(run.tokens(), static_cast<int>(ids.size()));
  EXPECT_EQ(run.events.back().kind, EngineEvent::Kind::kFinished);
  EXPECT_EQ(run.events.back().seed, 42u);
  EXPECT_TRUE(proc.finished());
  EXPECT_FALSE(proc.stop_after());
}

TEST_F(OutputProcessorTest, AStopStringEndsTheStreamAndCountsTheKeptTokens) {
  const std::vector<int32_t> ids = encode("The Debian project makes a free operating system.");
  SamplingParams p;
  p.stop = {"free op"};
  OutputProcessor proc(&*tokenizer_, p, 1);
  Events run;
  int fed = 0;
  for (int32_t id : ids) {
    proc.process(token(id), run.events);
    ++fed;
    if (proc.finished()) break;
  }
  ASSERT_TRUE(proc.stop_after());
  EXPECT_EQ(*proc.stop_after(), fed);
  EXPECT_EQ(run.text(), "The Debian project makes a ");
  const EngineEvent& last = run.events.back();
  EXPECT_EQ(last.kind, EngineEvent::Kind::kFinished);
  EXPECT_EQ(last.reason, FinishReason::kStop);
  EXPECT_EQ(last.stop_reason, StopReason(std::string("free op")));
  EXPECT_EQ(last.usage.completion_tokens, fed);
  // What the engine produced meanwhile is dropped.
  const size_t n = run.events.size();
  proc.process(token(ids.back()), run.events);
  proc.process(finished(FinishReason::kStop), run.events);
  EXPECT_EQ(run.events.size(), n);
}

TEST_F(OutputProcessorTest, StopTokensCarryTextOnlyWhenAsked) {
  const std::vector<int32_t> ids = encode("Hello there");
  for (bool include : {false, true}) {
    SamplingParams p;
    p.include_stop_str_in_output = include;
    OutputProcessor proc(&*tokenizer_, p, 1);
    Events run;
    for (size_t i = 0; i < ids.size(); ++i) proc.process(token(ids[i], i + 1 == ids.size()), run.events);
    RequestUpdate done = finished(FinishReason::kStop);
    done.stop_reason = ids.back();
    proc.process(done, run.events);
    const std::vector<int32_t> kept(ids.begin(), include ? ids.end() : ids.end() - 1);
    EXPECT_EQ(run.text(), tokenizer_->decode(kept, true)) << include;
    EXPECT_EQ(run.events.back().stop_reason, StopReason(ids.back()));
  }
}

TEST_F(OutputProcessorTest, StopStringsWaitForMinTokens) {
  const std::vector<int32_t> ids = encode("stop here and stop there");
  SamplingParams p;
  p.stop = {"stop"};
  p.min_tokens = 2;
  OutputProcessor proc(&*tokenizer_, p, 1);
  Events run;
  for (int32_t id : ids) {
    proc.process(token(id), run.events);
    if (proc.finished()) break;
  }
  ASSERT_TRUE(proc.finished());
  // The first "stop" came before min_tokens: the second one ends it.
  EXPECT_EQ(run.text(), "stop here and ");
}

TEST(OutputProcessorNoTokenizer, EventsCarryIdsOnly) {
  SamplingParams p;
  OutputProcessor proc(nullptr, p, 9);
  std::deque<EngineEvent> events;
  proc.process(token(5), events);
  proc.process(token(6), events);
  proc.process(finished(FinishReason::kLength), events);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1].token, 6);
  for (const EngineEvent& e : events) EXPECT_EQ(e.text, "");
}

}  // namespace
}  // namespace basalt

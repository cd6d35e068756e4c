#include "loadgen/workload.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loadgen/runner.h"

namespace basalt::loadgen {
namespace {

const Tokenizer& bundled() {
  static const Tokenizer t = load_tokenizer_dir(BASALT_MODEL_DIR).tokenizer;
  return t;
}

// The error message of f(), or "" when it does not throw.
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ShareGpt, ParsesJsonArrayAndJsonl) {
  const std::string array = R"([
    {"id": "a", "conversations": [{"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"}]},
    {"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "Q2"},
                       {"from": "gpt", "value": "A2"}, {"from": "human", "value": "Q3"}]},
    {"conversations": [{"from": "gpt", "value": "only an answer"}]},
    {"conversations": []}
  ])";
  int64_t skipped = -1;
  std::vector<ShareGptPair> p = parse_sharegpt(array, "f.json", &skipped);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].prompt, "Q1");
  EXPECT_EQ(p[0].answer, "A1");
  EXPECT_EQ(p[1].prompt, "Q2");
  EXPECT_EQ(p[1].answer, "A2");
  EXPECT_EQ(skipped, 2);
  const std::string jsonl =
      "{\"conversations\": [{\"from\": \"user\", \"value\": \"x\"}, {\"from\": \"assistant\", \"value\": \"y\"}]}\n"
      "\n"
      "{\"conversations\": [{\"from\": \"human\", \"value\": \"p\"}, {\"from\": \"chatgpt\", \"value\": \"q\"}]}\r\n";
  p = parse_sharegpt(jsonl, "f.jsonl", &skipped);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[1].answer, "q");
  EXPECT_EQ(skipped, 0);
}

TEST(ShareGpt, MalformedFilesGiveClearErrors) {
  auto err = [](const std::string& text) { return error_of([&] { parse_sharegpt(text, "data.json", nullptr); }); };
  EXPECT_NE(err("").find("data.json: the file is empty"), std::string::npos);
  EXPECT_NE(err("[{\"conversations\": [}]").find("data.json: not valid JSON"), std::string::npos);
  EXPECT_NE(err("[1]").find("data.json: entry 0: not a JSON object"), std::string::npos);
  EXPECT_NE(err("[{}]").find("entry 0: no \"conversations\" field"), std::string::npos);
  EXPECT_NE(err("[{\"conversations\": {}}]").find("\"conversations\" is not an array"), std::string::npos);
  EXPECT_NE(err("[{\"conversations\": [{\"from\": \"human\"}]}]").find("conversations[0].value is missing"),
            std::string::npos);
  EXPECT_NE(err("[{\"conversations\": [{\"from\": 3, \"value\": \"x\"}]}]").find("conversations[0].from"),
            std::string::npos);
  EXPECT_NE(err("[{\"conversations\": [{\"from\": \"robot\", \"value\": \"x\"}]}]").find("\"robot\""),
            std::string::npos);
  // JSONL errors name the line.
  const std::string jsonl = "{\"conversations\": []}\n{\"conversations\": [\n";
  EXPECT_NE(err(jsonl).find("data.json:2: not valid JSON"), std::string::npos) << err(jsonl);
  EXPECT_NE(err("{\"conversations\": 5}\n").find("data.json:1: \"conversations\" is not an array"), std::string::npos);
}

TEST(ShareGpt, LoadFiltersAndRepeats) {
  const auto path = std::filesystem::temp_directory_path() / ("sharegpt_" + std::to_string(::getpid()) + ".json");
  {
    std::ofstream out(path);
    out << R"([{"conversations": [{"from": "human", "value": "Tell me how Debian packages are built from source."},
                                  {"from": "gpt", "value": "With dpkg-buildpackage, which runs the rules file."}]},
              {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello there, how are you today?"}]}])";
  }
  TextMaker maker(bundled());
  const std::vector<Conversation> c = load_sharegpt(path.string(), maker, {5, 0, 1024}, 1);
  ASSERT_EQ(c.size(), 5u);  // one usable entry ("Hi" is under 4 tokens), repeated
  for (const Conversation& x : c) {
    EXPECT_EQ(x.turns[0].question.rfind("Tell me", 0), 0u);
    EXPECT_EQ(x.turns[0].max_tokens, maker.count("With dpkg-buildpackage, which runs the rules file."));
  }
  EXPECT_EQ(load_sharegpt(path.string(), maker, {1, 9, 1024}, 1)[0].turns[0].max_tokens, 9);
  EXPECT_NE(error_of([&] { load_sharegpt(path.string(), maker, {1, 0, 3}, 1); }).find("no usable conversation"),
            std::string::npos);
  std::filesystem::remove(path);
  EXPECT_NE(error_of([&] { load_sharegpt(path.string(), maker, {1, 0, 1024}, 1); }).find("cannot read"),
            std::string::npos);
}

TEST(TextMaker, MakesTheAskedTokenCount) {
  TextMaker maker(bundled());
  std::mt19937_64 rng(5);
  int exact = 0;
  for (int64_t n : {1, 7, 64, 256, 1000}) {
    int64_t actual = 0;
    const std::string text = maker.make(rng, n, &actual);
    EXPECT_EQ(actual, maker.count(text));
    EXPECT_NEAR(static_cast<double>(actual), static_cast<double>(n), 1.0 + n * 0.01);
    exact += actual == n ? 1 : 0;
    for (unsigned char ch : text) EXPECT_TRUE(ch >= 0x20 && ch <= 0x7e);
  }
  EXPECT_GE(exact, 4);
}

TEST(Workloads, RandomIsSeededAndSpreadsLengths) {
  TextMaker maker(bundled());
  const std::vector<Conversation> a = make_random(maker, {20, 32, 16, 0.5}, 9);
  const std::vector<Conversation> b = make_random(maker, {20, 32, 16, 0.5}, 9);
  ASSERT_EQ(a.size(), 20u);
  bool varied = false;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].turns.size(), 1u);
    EXPECT_EQ(a[i].turns[0].question, b[i].turns[0].question);
    EXPECT_GE(a[i].turns[0].max_tokens, 8);
    EXPECT_LE(a[i].turns[0].max_tokens, 24);
    varied |= a[i].turns[0].max_tokens != a[0].turns[0].max_tokens;
  }
  EXPECT_TRUE(varied);
  for (const Conversation& c : make_random(maker, {3, 40, 16, 0}, 1)) EXPECT_EQ(c.turns[0].max_tokens, 16);
  EXPECT_THROW(make_random(maker, {0, 40, 16, 0}, 1), Error);
  EXPECT_THROW(make_random(maker, {1, 40, 16, 1.0}, 1), Error);
  EXPECT_THROW(make_random(maker, {1, 0, 16, 0}, 1), Error);
}

TEST(Workloads, SharedPrefixGroupsShareTheirSystemPrompt) {
  TextMaker maker(bundled());
  const std::vector<Conversation> c = make_shared_prefix(maker, {3, 4, 100, 10, 8, 0}, 2);
  ASSERT_EQ(c.size(), 12u);
  for (size_t i = 0; i < c.size(); ++i) {
    ASSERT_EQ(c[i].leading.size(), 1u);
    EXPECT_EQ(c[i].leading[0].content, c[i % 3].leading[0].content);  // interleaved groups
    EXPECT_NEAR(static_cast<double>(c[i].leading_tokens), 100, 2);
  }
  EXPECT_NE(c[0].leading[0].content, c[1].leading[0].content);
  EXPECT_THROW(make_shared_prefix(maker, {0, 4, 100, 10, 8, 0}, 2), Error);
}

TEST(Workloads, MultiTurnBodiesGrowWithEachAnswer) {
  TextMaker maker(bundled());
  const std::vector<Conversation> c = make_multi_turn(maker, {2, 3, 10, 5, 0}, 4);
  ASSERT_EQ(c.size(), 2u);
  ASSERT_EQ(c[0].turns.size(), 3u);
  RunOptions chat;
  chat.chat = true;
  chat.model = "m";
  chat.ignore_eos = true;
  const nlohmann::json b = nlohmann::json::parse(build_body(c[0], 2, {"ans0", "ans1"}, chat));
  ASSERT_EQ(b["messages"].size(), 5u);
  EXPECT_EQ(b["messages"][1]["content"], "ans0");
  EXPECT_EQ(b["messages"][3]["role"], "assistant");
  EXPECT_EQ(b["messages"][4]["content"], c[0].turns[2].question);
  EXPECT_EQ(b["model"], "m");
  EXPECT_EQ(b["ignore_eos"], true);
  EXPECT_EQ(b["max_tokens"], 5);
  EXPECT_EQ(b["stream_options"]["include_usage"], true);
  RunOptions completions;
  completions.include_usage = false;
  const nlohmann::json p = nlohmann::json::parse(build_body(c[0], 1, {"ans0"}, completions));
  EXPECT_EQ(p["prompt"], c[0].turns[0].question + "\n\nans0\n\n" + c[0].turns[1].question);
  EXPECT_FALSE(p.contains("model"));
  EXPECT_FALSE(p.contains("stream_options"));
  EXPECT_FALSE(p.contains("ignore_eos"));
  EXPECT_EQ(p["stream"], true);
}

}  // namespace
}  // namespace basalt::loadgen

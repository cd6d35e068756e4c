// `basalt generate --batch`: many requests from a JSONL file run together
// through the engine; each output line must equal what the same request
// gives alone through `basalt generate --json`, in input order.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "testing/cli_test_util.h"

namespace {

using nlohmann::json;
const std::string kLlama = std::string(BASALT_TESTDATA) + "/models/llama";

using basalt::cli_test::CliRun;
using basalt::cli_test::run;

std::string write_file(const std::string& name, const std::string& content) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("basalt_batch_test_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(path) << content;
  return path.string();
}

std::vector<json> lines(const std::string& out) {
  std::vector<json> v;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) v.push_back(json::parse(line));
  return v;
}

TEST(GenerateBatch, EachLineEqualsTheRequestAloneInInputOrder) {
  const std::vector<std::string> requests = {
      R"({"prompt_ids": [139, 190, 81, 313, 198, 84], "max_tokens": 12, "temperature": 0})",
      R"({"prompt": "The weather", "max_tokens": 9, "seed": 7})",
      R"({"prompt_ids": [139, 190, 81, 5], "max_tokens": 10, "temperature": 0.7, "top_k": 20, "seed": 3, "stop": [" t"]})",
      R"({"prompt_ids": [139, 190, 81, 313, 198, 84, 9], "max_tokens": 6, "temperature": 0, "top_logprobs": 2})",
      R"({"prompt_ids": [1, 400]})",
  };
  const std::vector<std::string> alone_flags = {
      "--prompt-ids 139,190,81,313,198,84 --max-tokens 12 --temperature 0",
      "--prompt 'The weather' --max-tokens 9 --seed 7",
      "--prompt-ids 139,190,81,5 --max-tokens 10 --temperature 0.7 --top-k 20 --seed 3 --stop ' t'",
      "--prompt-ids 139,190,81,313,198,84,9 --max-tokens 6 --temperature 0 --top-logprobs 2",
  };
  std::string content;
  for (const auto& r : requests) content += r + "\n\n";
  const std::string file = write_file("ok.jsonl", content);
  const CliRun batch = run("generate --model " + kLlama + " --ignore-eos --batch " + file);
  std::filesystem::remove(file);
  ASSERT_EQ(batch.exit_code, 0) << batch.err;
  const std::vector<json> out = lines(batch.out);
  ASSERT_EQ(out.size(), requests.size()) << batch.out;
  for (size_t i = 0; i < alone_flags.size(); ++i) {
    const CliRun alone = run("generate --model " + kLlama + " --ignore-eos --json " + alone_flags[i]);
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
    const json want = json::parse(alone.out);
    EXPECT_EQ(out[i]["index"], i);
    for (const char* key : {"prompt_ids", "output_ids", "text", "finish_reason", "stop_reason"})
      EXPECT_EQ(out[i][key], want[key]) << "request " << i << " " << key;
    if (requests[i].find("seed") != std::string::npos) {
      EXPECT_EQ(out[i]["seed"], want["seed"]);
    }
    EXPECT_EQ(out[i]["top_logprobs"].size(), want["top_logprobs"].size());
    EXPECT_EQ(out[i]["usage"]["completion_tokens"], out[i]["output_ids"].size());
  }
  EXPECT_EQ(out[4]["finish_reason"], "error");
  EXPECT_NE(out[4]["error"].get<std::string>().find("outside the vocabulary"), std::string::npos);
}

TEST(GenerateBatch, BadFilesExitNonZeroNamingTheLine) {
  for (const std::string& content : {std::string("{\"prompt_ids\": [1, 2]}\nnot json\n"),
                                     std::string("{\"prompt_ids\": [1, 2], \"max_tokens\": \"many\"}\n"),
                                     std::string("{\"prompt_ids\": [1, 2], \"colour\": 3}\n"),
                                     std::string("{\"max_tokens\": 3}\n"), std::string("\n")}) {
    const std::string file = write_file("bad.jsonl", content);
    const CliRun r = run("generate --model " + kLlama + " --batch " + file);
    std::filesystem::remove(file);
    EXPECT_EQ(r.exit_code, 1) << content;
    EXPECT_TRUE(r.out.empty()) << content;
    EXPECT_NE(r.err.find("bad.jsonl"), std::string::npos) << r.err;
  }
  // A bad value names the line and the field.
  for (const auto& [content, field] : std::vector<std::pair<std::string, std::string>>{
           {"{\"prompt_ids\": [1, 2]}\n{\"prompt_ids\": [1], \"max_tokens\": \"many\"}\n", "max_tokens"},
           {"{\"prompt_ids\": [1], \"stop\": [1]}\n", "stop"},
           {"{\"prompt_ids\": [1], \"temperature\": -2}\n", "temperature"}}) {
    const std::string file = write_file("field.jsonl", content);
    const CliRun r = run("generate --model " + kLlama + " --batch " + file);
    std::filesystem::remove(file);
    EXPECT_EQ(r.exit_code, 1) << content;
    EXPECT_NE(r.err.find("field.jsonl:"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(field), std::string::npos) << r.err;
  }
  EXPECT_EQ(run("generate --model " + kLlama + " --batch /nonexistent/file.jsonl").exit_code, 1);
  EXPECT_NE(run("generate --model " + kLlama + " --batch x.jsonl --prompt-ids 1").exit_code, 0);
}

}  // namespace

// Acceptance tests of the `basalt` command line: the real binary, run as a
// user runs it, with its JSON output parsed and checked against the
// transformers fixtures.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

using nlohmann::json;
const std::string kModels = std::string(BASALT_TESTDATA) + "/models/";

struct CliRun {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

CliRun run(const std::string& args) {
  const auto err_path = std::filesystem::temp_directory_path() /
                        ("basalt_cli_test_" + std::to_string(::getpid()) + ".err");
  const std::string command = std::string(BASALT_BINARY) + " " + args + " 2>" + err_path.string();
  CliRun r;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) r.out.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  r.err.assign(std::istreambuf_iterator<char>(err), {});
  std::filesystem::remove(err_path);
  return r;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

std::string join(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s.push_back(',');
    s.append(std::to_string(ids[i]));
  }
  return s;
}

TEST(Cli, GreedyGenerateMatchesTransformers) {
  for (const char* name : {"llama", "qwen3"}) {
    const json ref = read_json(kModels + name + "/reference.json");
    const std::vector<int> prompt = ref["greedy_prompt"];
    const CliRun r = run("generate --model " + kModels + name + " --prompt-ids " + join(prompt) +
                      " --max-tokens 8 --temperature 0 --ignore-eos --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json out = json::parse(r.out);
    EXPECT_EQ(out["prompt_ids"].get<std::vector<int>>(), prompt);
    const std::vector<int> expected(ref["greedy_output"].begin(), ref["greedy_output"].begin() + 8);
    EXPECT_EQ(out["output_ids"].get<std::vector<int>>(), expected) << name;
    EXPECT_EQ(out["finish_reason"], "length");
    EXPECT_TRUE(out["text"].is_string());
  }
}

TEST(Cli, GenerateRunsDeepseekCheckpointsAndReportsWhatItLoaded) {
  // The published layouts (per-expert tensors, block FP8, MTP layer) run
  // unchanged; the loading summary goes to stderr.
  for (const char* name : {"deepseek_v3", "deepseek_v3_fp8", "deepseek_v2_lite"}) {
    const json ref = read_json(kModels + name + "/reference.json");
    const std::vector<int> prompt = ref["greedy_prompt"];
    const CliRun r = run("generate --model " + kModels + name + " --prompt-ids " + join(prompt) +
                         " --max-tokens 8 --temperature 0 --ignore-eos --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json out = json::parse(r.out);
    const std::vector<int> expected(ref["greedy_output"].begin(), ref["greedy_output"].begin() + 8);
    EXPECT_EQ(out["output_ids"].get<std::vector<int>>(), expected) << name;
    EXPECT_NE(r.err.find("routed experts"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("parameters"), std::string::npos) << r.err;
  }
}

TEST(Cli, TextPromptGetsBosAndLogprobsAreSorted) {
  const CliRun r = run("generate --model " + kModels +
                    "llama --prompt 'Basalt is' --max-tokens 3 --seed 5 --top-logprobs 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = json::parse(r.out);
  EXPECT_EQ(out["prompt_ids"][0], 0);  // <s>, added by the tokenizer's post-processor
  ASSERT_EQ(out["top_logprobs"].size(), out["output_ids"].size());
  for (const json& step : out["top_logprobs"]) {
    ASSERT_EQ(step.size(), 4u);
    for (size_t i = 0; i < step.size(); ++i) {
      EXPECT_LE(step[i]["logprob"].get<double>(), 0.0);
      if (i > 0) {
        EXPECT_GE(step[i - 1]["logprob"].get<double>(), step[i]["logprob"].get<double>());
      }
    }
  }
}

TEST(Cli, SameSeedSameOutput) {
  const std::string args = "generate --model " + kModels +
                           "mistral --prompt-ids 3,4,5 --max-tokens 12 --temperature 1 --ignore-eos --json --seed ";
  const CliRun a = run(args + "42"), b = run(args + "42"), c = run(args + "43");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(json::parse(a.out)["output_ids"], json::parse(b.out)["output_ids"]);
  EXPECT_NE(json::parse(a.out)["output_ids"], json::parse(c.out)["output_ids"]);
}

TEST(Cli, StopsOnEndOfSequence) {
  // Make the first greedy token the end-of-sequence id: generation stops
  // there, reports "stop" and keeps the token in output_ids.
  const json ref = read_json(kModels + "qwen2/reference.json");
  const int first = ref["greedy_output"][0];
  const auto dir = std::filesystem::temp_directory_path() / "basalt_cli_eos";
  std::filesystem::remove_all(dir);
  std::filesystem::copy(kModels + "qwen2", dir);
  json gen = read_json((dir / "generation_config.json").string());
  gen["eos_token_id"] = json::array({first});
  std::ofstream(dir / "generation_config.json") << gen.dump();
  const std::vector<int> prompt = ref["greedy_prompt"];
  const CliRun r = run("generate --model " + dir.string() + " --prompt-ids " + join(prompt) +
                    " --max-tokens 8 --temperature 0 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = json::parse(r.out);
  EXPECT_EQ(out["finish_reason"], "stop");
  EXPECT_EQ(out["output_ids"], json::array({first}));
  std::filesystem::remove_all(dir);
}

TEST(Cli, TokenizeAndDetokenize) {
  CliRun r = run("tokenize --model " + kModels + "llama --text 'Basalt is rock' --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<int> ids = json::parse(r.out)["ids"];
  ASSERT_FALSE(ids.empty());
  EXPECT_NE(ids[0], 0);  // no BOS without --add-special-tokens
  r = run("tokenize --model " + kModels + "llama --text 'Basalt is rock' --add-special-tokens --json");
  EXPECT_EQ(json::parse(r.out)["ids"][0], 0);
  r = run("detokenize --model " + kModels + "llama --ids " + join(ids) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["text"], "Basalt is rock");
}

TEST(Cli, BadInputExitsNonZeroWithOneLine) {
  const std::string model = " --model " + kModels + "llama";
  const std::vector<std::string> cases = {
      "generate" + model + " --prompt x --no-such-flag",
      "generate --model /nonexistent/model --prompt x",
      "generate" + model + " --prompt x --max-tokens many",
      "generate" + model + " --prompt-ids 1,two,3",
      "generate" + model + " --prompt-ids 1,99999",
      "generate" + model + " --prompt x --prompt-ids 1",
      "generate" + model,
      "generate" + model + " --prompt x --top-p 0",
      "generate" + model + " --prompt x --temperature -1",
      "tokenize" + model,
      "detokenize" + model + " --ids 1,2,100000",
      "frobnicate",
  };
  for (const std::string& args : cases) {
    const CliRun r = run(args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_EQ(r.out, "") << args;
    ASSERT_FALSE(r.err.empty()) << args;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << args << ": " << r.err;
  }
}

}  // namespace

// Acceptance tests of the `basalt` command line: the real binary, run as a
// user runs it, with its JSON output parsed and checked against the
// transformers fixtures.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "testing/cli_test_util.h"

namespace {

using nlohmann::json;
const std::string kModels = std::string(BASALT_TESTDATA) + "/models/";

using basalt::cli_test::CliRun;
using basalt::cli_test::run;
using basalt::cli_test::run_with_env;

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

// One tensor of a safetensors file, read without the engine's parser.
template <typename T>
std::vector<T> read_safetensor(const std::string& path, const std::string& name) {
  std::ifstream in(path, std::ios::binary);
  uint64_t header_size = 0;
  in.read(reinterpret_cast<char*>(&header_size), 8);
  std::string header(header_size, ' ');
  in.read(header.data(), static_cast<std::streamsize>(header_size));
  const json entry = json::parse(header).at(name);
  const uint64_t begin = entry["data_offsets"][0], end = entry["data_offsets"][1];
  std::vector<T> values((end - begin) / sizeof(T));
  in.seekg(static_cast<std::streamoff>(8 + header_size + begin));
  in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(end - begin));
  return values;
}

// Mean next-token NLL of ids under logits [ids.size(), vocab], in double.
double mean_nll(const std::vector<int>& ids, const std::vector<float>& logits) {
  const size_t vocab = logits.size() / ids.size();
  double sum = 0;
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    const float* row = logits.data() + t * vocab;
    double max = row[0], z = 0;
    for (size_t v = 0; v < vocab; ++v) max = std::max(max, static_cast<double>(row[v]));
    for (size_t v = 0; v < vocab; ++v) z += std::exp(row[v] - max);
    sum += max + std::log(z) - row[ids[t + 1]];
  }
  return sum / static_cast<double>(ids.size() - 1);
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("basalt_cli_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
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

TEST(Cli, PagedKvGivesTheSameSamples) {
  const std::string args = "generate --prompt 'The Debian project is' --max-tokens 10 --temperature 0.9 --seed 5 "
                           "--n 3 --ignore-eos --json";
  const CliRun flat = run(args);
  ASSERT_EQ(flat.exit_code, 0) << flat.err;
  for (const char* page : {"4", "16"}) {
    const CliRun paged = run(args + " --page-size " + page);
    ASSERT_EQ(paged.exit_code, 0) << paged.err;
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(json::parse(paged.out)["choices"][i]["output_ids"], json::parse(flat.out)["choices"][i]["output_ids"])
          << "page size " << page << " sample " << i;
  }
}

// The bundled model repeats itself here, so n-gram drafts come and some
// are accepted; the text is plain decoding's, token for token.
TEST(Cli, SpeculativeDecodingGivesPlainDecodingsTokens) {
  const std::string args = "generate --prompt 'The cat sat on the mat. The cat sat on the mat. The cat sat on the' "
                           "--max-tokens 40 --json ";
  for (const char* sampling : {"--temperature 0", "--temperature 1 --seed 9"}) {
    const CliRun plain = run(args + sampling);
    const CliRun spec = run(args + sampling + " --speculative-algorithm ngram --speculative-num-draft-tokens 3");
    ASSERT_EQ(spec.exit_code, 0) << spec.err;
    const json p = json::parse(plain.out), s = json::parse(spec.out);
    EXPECT_EQ(s["output_ids"], p["output_ids"]) << sampling;
    EXPECT_FALSE(p.contains("speculative"));
    // Sampled text rarely repeats an earlier pair of tokens; greedy text does.
    if (std::string(sampling) == "--temperature 0") {
      EXPECT_GT(s["speculative"]["draft_tokens"].get<int>(), 0);
    }
    EXPECT_LE(s["speculative"]["accepted_tokens"].get<int>(), s["speculative"]["draft_tokens"].get<int>());
  }
  const CliRun bad = run("generate --prompt x --speculative-algorithm eagle9");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("unknown speculative algorithm \"eagle9\""), std::string::npos) << bad.err;
}

// An EAGLE head (the test fixture's random one, for the llama fixture)
// drafts through `generate`; the tokens are plain decoding's. The head's
// directory is not a model, and eagle needs one.
TEST(Cli, EagleHeadDraftsThroughGenerate) {
  const std::string head = std::string(BASALT_TESTDATA) + "/eagle/llama_head";
  const std::string args = "generate --model " + kModels + "llama --prompt-ids 5,6,7,8,5,6,7 --max-tokens 24 --json ";
  const CliRun plain = run(args + "--temperature 0");
  const CliRun spec = run(args + "--temperature 0 --speculative-algorithm eagle --speculative-draft-model " + head);
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  EXPECT_EQ(json::parse(spec.out)["output_ids"], json::parse(plain.out)["output_ids"]);
  EXPECT_GT(json::parse(spec.out)["speculative"]["draft_tokens"].get<int>(), 0);
  const CliRun missing = run(args + "--speculative-algorithm eagle");
  EXPECT_NE(missing.err.find("--speculative-algorithm eagle needs --speculative-draft-model"), std::string::npos)
      << missing.err;
  const CliRun as_model = run("generate --model " + head + " --prompt-ids 5,6 --max-tokens 2");
  EXPECT_NE(as_model.err.find("is an EAGLE draft head"), std::string::npos) << as_model.err;
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

TEST(Cli, SamplingAndStoppingFlags) {
  const std::string base = "generate --model " + kModels +
                           "llama --prompt-ids 139,190,81,313,198,84 --temperature 0 --max-tokens 48";
  auto generate_json = [&](const std::string& flags) {
    const CliRun r = run(base + " --ignore-eos --json " + flags);
    EXPECT_EQ(r.exit_code, 0) << flags << ": " << r.err;
    return r.exit_code == 0 ? json::parse(r.out) : json::object();
  };
  auto repeats = [](const json& out) {
    const std::vector<int> ids = out["output_ids"];
    return ids.size() - std::set<int>(ids.begin(), ids.end()).size();
  };
  const json plain = generate_json("");
  EXPECT_TRUE(plain["stop_reason"].is_null());
  const std::vector<int> ids = plain["output_ids"];
  const std::string text = plain["text"];
  ASSERT_EQ(ids.size(), 48u);

  // --stop: the text ends before the first occurrence; stop_reason names it.
  // Streaming (no --json) prints the same text.
  std::string stop;
  for (size_t at = 2; at + 2 < text.size() && stop.empty(); ++at) {
    const std::string candidate = text.substr(at, 2);
    const bool plain_ascii = std::all_of(candidate.begin(), candidate.end(),
                                         [](char c) { return std::isalnum(static_cast<unsigned char>(c)); });
    if (plain_ascii) stop = candidate;
  }
  ASSERT_FALSE(stop.empty()) << text;
  json out = generate_json("--stop zzzz --stop " + stop);
  EXPECT_EQ(out["finish_reason"], "stop");
  EXPECT_EQ(out["stop_reason"], stop);
  EXPECT_EQ(out["text"], text.substr(0, text.find(stop)));
  EXPECT_LT(out["output_ids"].size(), ids.size());
  CliRun streamed = run(base + " --ignore-eos --stop " + stop);
  ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
  EXPECT_EQ(streamed.out, out["text"].get<std::string>() + "\n");
  out = generate_json("--stop " + stop + " --include-stop-str");
  EXPECT_EQ(out["text"], text.substr(0, text.find(stop) + stop.size()));

  // --stop-token-ids: stops after the id (even with --ignore-eos).
  out = generate_json("--stop-token-ids " + std::to_string(ids[2]));
  EXPECT_EQ(out["output_ids"], json(std::vector<int>(ids.begin(), ids.begin() + 3)));
  EXPECT_EQ(out["finish_reason"], "stop");
  EXPECT_EQ(out["stop_reason"], ids[2]);

  // --logit-bias forces a token; --repetition-penalty and --frequency-penalty
  // stop the greedy output from repeating itself.
  out = generate_json("--logit-bias 77:100,5:-3");
  EXPECT_EQ(out["output_ids"], json(std::vector<int>(48, 77)));
  ASSERT_GT(repeats(plain), 0u);
  EXPECT_EQ(repeats(generate_json("--repetition-penalty 1000000")), 0u);
  EXPECT_LT(repeats(generate_json("--frequency-penalty 2")), repeats(plain));
  EXPECT_LT(repeats(generate_json("--presence-penalty 2")), repeats(plain));

  // --min-tokens holds back the end-of-sequence id (1) until 3 tokens are out.
  CliRun r = run(base + " --json --logit-bias 1:100 --min-tokens 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  out = json::parse(r.out);
  EXPECT_EQ(out["output_ids"].size(), 4u);
  EXPECT_EQ(out["output_ids"][3], 1);
  EXPECT_EQ(out["finish_reason"], "stop");
  EXPECT_TRUE(out["stop_reason"].is_null());

  // Without --seed each run draws its own seed and reports it.
  const std::string sampled = "generate --model " + kModels +
                              "llama --prompt-ids 3,4,5 --max-tokens 12 --ignore-eos --json";
  const json a = json::parse(run(sampled).out), b = json::parse(run(sampled).out);
  EXPECT_NE(a["seed"], b["seed"]);
  const json again = json::parse(run(sampled + " --seed " + std::to_string(a["seed"].get<uint64_t>())).out);
  EXPECT_EQ(again["output_ids"], a["output_ids"]);

  // --n draws samples with seeds derived from --seed; the first is the
  // plain run's.
  const json one = json::parse(run(sampled + " --seed 5").out);
  r = run(sampled + " --seed 5 --n 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json three = json::parse(r.out);
  EXPECT_EQ(three["seed"], 5);
  ASSERT_EQ(three["choices"].size(), 3u);
  EXPECT_EQ(three["choices"][0]["output_ids"], one["output_ids"]);
  EXPECT_EQ(three["choices"][0]["text"], one["text"]);
  EXPECT_NE(three["choices"][1]["output_ids"], one["output_ids"]);
  EXPECT_NE(three["choices"][1]["output_ids"], three["choices"][2]["output_ids"]);
  EXPECT_EQ(json::parse(run(sampled + " --seed 5 --n 3").out), three);
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

TEST(Cli, EvalPerplexityMatchesTransformersLogits) {
  // Perplexity of the fixture prompts from the logits transformers computed.
  for (const char* name : {"llama", "qwen3", "mistral"}) {
    const std::string ref = kModels + name + "/reference.safetensors";
    const json meta = read_json(kModels + name + "/reference.json");
    for (size_t p = 0; p < meta["prompt_lengths"].size(); ++p) {
      const std::string prefix = "prompt_" + std::to_string(p);
      const std::vector<int32_t> raw = read_safetensor<int32_t>(ref, prefix + ".ids");
      const std::vector<int> ids(raw.begin(), raw.end());
      if (ids.size() < 2) continue;
      const double nll = mean_nll(ids, read_safetensor<float>(ref, prefix + ".logits"));
      const CliRun r = run("eval --model " + kModels + name + " --ids " + join(ids) + " --json --dtype float32");
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const json out = json::parse(r.out);
      EXPECT_EQ(out["tokens"], ids.size() - 1) << name;
      EXPECT_NEAR(out["perplexity"].get<double>() / std::exp(nll), 1.0, 1e-4) << name << " " << prefix;
      EXPECT_NEAR(out["nll_mean"].get<double>(), nll, 1e-4 * nll) << name << " " << prefix;
      EXPECT_GT(out["tokens_per_second"].get<double>(), 0.0);
    }
  }
}

TEST(Cli, EvalWindowsOverlapByOneTokenAndScoreEachTokenOnce) {
  // 23 ids in windows of 8: [0, 8), [7, 15), [14, 22), [21, 23), which score
  // 7 + 7 + 7 + 1 tokens, each from the tokens before it in its window.
  const std::string model = " --model " + kModels + "llama";
  const std::vector<int32_t> raw =
      read_safetensor<int32_t>(kModels + "llama/reference.safetensors", "prompt_2.ids");
  const std::vector<int> ids(raw.begin(), raw.end());
  ASSERT_EQ(ids.size(), 23u);
  const CliRun whole = run("eval" + model + " --ids " + join(ids) + " --context 8 --json");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const json out = json::parse(whole.out);
  EXPECT_EQ(out["tokens"], 22);
  double nll_sum = 0;
  for (size_t start : {0, 7, 14, 21}) {
    const std::vector<int> window(ids.begin() + static_cast<std::ptrdiff_t>(start),
                                  ids.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(start + 8, 23)));
    const CliRun r = run("eval" + model + " --ids " + join(window) + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json w = json::parse(r.out);
    nll_sum += w["nll_mean"].get<double>() * w["tokens"].get<double>();
  }
  EXPECT_NEAR(out["nll_mean"].get<double>(), nll_sum / 22, 1e-9);
}

TEST(Cli, EvalEncodesTheTextFileWithBos) {
  const std::string text_file = temp_path("eval.txt");
  // No trailing newline: the shell's $(cat ...) below would drop it.
  std::ofstream(text_file) << "Basalt is a dark, fine-grained volcanic rock.\nIt forms from lava that cools quickly.";
  const std::string model = " --model " + kModels + "llama";
  CliRun r = run("tokenize" + model + " --text \"$(cat " + text_file + ")\" --add-special-tokens --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<int> ids = json::parse(r.out)["ids"];
  ASSERT_EQ(ids[0], 0);  // BOS
  r = run("eval" + model + " --text-file " + text_file + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json from_text = json::parse(r.out);
  EXPECT_EQ(from_text["tokens"], ids.size() - 1);
  r = run("eval" + model + " --ids " + join(ids) + " --json");
  EXPECT_EQ(json::parse(r.out)["perplexity"], from_text["perplexity"]);
  // --max-tokens keeps the first N tokens.
  r = run("eval" + model + " --text-file " + text_file + " --max-tokens 10 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["tokens"], 9);
  ids.resize(10);
  EXPECT_EQ(json::parse(run("eval" + model + " --ids " + join(ids) + " --json").out)["perplexity"],
            json::parse(r.out)["perplexity"]);
  // Plain output: one line of perplexity, one of speed.
  r = run("eval" + model + " --text-file " + text_file);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("perplexity ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(" tokens/s"), std::string::npos) << r.out;
  std::filesystem::remove(text_file);
}

std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes(std::istreambuf_iterator<char>(in), {});
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

// log softmax of a row, in double.
std::vector<double> log_probs(const float* row, size_t vocab) {
  double max = row[0], z = 0;
  for (size_t v = 0; v < vocab; ++v) max = std::max(max, static_cast<double>(row[v]));
  for (size_t v = 0; v < vocab; ++v) z += std::exp(row[v] - max);
  std::vector<double> out(vocab);
  for (size_t v = 0; v < vocab; ++v) out[v] = row[v] - max - std::log(z);
  return out;
}

size_t arg_max(const float* row, size_t vocab) { return static_cast<size_t>(std::max_element(row, row + vocab) - row); }

TEST(Cli, EvalTop1MatchesTransformersLogits) {
  for (const char* name : {"llama", "qwen3", "mistral", "deepseek_v3"}) {
    const std::string ref = kModels + name + "/reference.safetensors";
    const json meta = read_json(kModels + name + "/reference.json");
    for (size_t p = 0; p < meta["prompt_lengths"].size(); ++p) {
      const std::string prefix = "prompt_" + std::to_string(p);
      const std::vector<int32_t> raw = read_safetensor<int32_t>(ref, prefix + ".ids");
      if (raw.size() < 2) continue;
      const std::vector<float> logits = read_safetensor<float>(ref, prefix + ".logits");
      const size_t vocab = logits.size() / raw.size();
      size_t hits = 0;
      for (size_t t = 0; t + 1 < raw.size(); ++t) hits += arg_max(logits.data() + t * vocab, vocab) == static_cast<size_t>(raw[t + 1]);
      const CliRun r = run("eval --model " + kModels + name + " --ids " +
                           join(std::vector<int>(raw.begin(), raw.end())) + " --json");
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(json::parse(r.out)["top1"].get<double>(), static_cast<double>(hits) / static_cast<double>(raw.size() - 1))
          << name << " " << prefix;
    }
  }
}

TEST(Cli, EvalAgainstItselfHasZeroKl) {
  const std::vector<int32_t> raw =
      read_safetensor<int32_t>(kModels + "deepseek_v3/reference.safetensors", "prompt_2.ids");
  const std::string ids = " --ids " + join(std::vector<int>(raw.begin(), raw.end())) + " --json";
  for (const char* name : {"deepseek_v3", "llama"}) {
    const std::string model = kModels + name;
    const CliRun r = run("eval --model " + model + " --compare-model " + model + ids + " --context 8");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json out = json::parse(r.out);
    EXPECT_EQ(out["kl_mean"].get<double>(), 0.0) << name;
    EXPECT_EQ(out["top1_agreement"].get<double>(), 1.0) << name;
    EXPECT_EQ(out["reference_perplexity"], out["perplexity"]) << name;
    EXPECT_EQ(out["tokens"], raw.size() - 1);
  }
}

// --fp8-compute: the CPU computes FP8 weights weight-only (w8a16), says so,
// and refuses w8a8 on every command that takes the flag, naming it.
TEST(Cli, Fp8ComputeOnTheCpu) {
  const std::string model = " --model " + kModels + "deepseek_v3_fp8";
  CliRun r = run("eval" + model + " --ids 1,2,3,4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json out = json::parse(r.out);
  EXPECT_EQ(out["device"], "cpu");
  EXPECT_EQ(out["fp8_compute"], "w8a16");
  r = run("eval" + model + " --ids 1,2,3,4 --fp8-compute w8a16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["perplexity"], out["perplexity"]);
  for (const std::string& command : {"eval" + model + " --ids 1,2,3,4", "generate" + model + " --prompt-ids 1,2 --max-tokens 2",
                                    "serve" + model + " --port 0"}) {
    SCOPED_TRACE(command);
    r = run(command + " --fp8-compute w8a8");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("--fp8-compute w8a8 --device cpu"), std::string::npos) << r.err;
    r = run(command + " --fp8-compute w4a16");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("--fp8-compute w4a16: expected auto, w8a8 or w8a16"), std::string::npos) << r.err;
  }
}

// One MTP draft per step: the head's drafts stay on the device and the next
// step moves them into its ids there (one rank), or waits for them on the
// host (tensor-parallel ranks, whose embedding reads ids on the host):
// transformers' greedy tokens either way.
TEST(Cli, MtpDraftsOnTheDeviceOrWaitedFor) {
  const json ref = read_json(kModels + "deepseek_v3/reference.json");
  const std::vector<int> prompt = ref["greedy_prompt"];
  const std::vector<int> expected(ref["greedy_output"].begin(), ref["greedy_output"].begin() + 8);
  for (const std::string tp : {"", " --tp 2"}) {
    const CliRun r = run("generate --model " + kModels + "deepseek_v3 --prompt-ids " + join(prompt) +
                         " --max-tokens 8 --temperature 0 --ignore-eos --json --speculative-algorithm mtp"
                         " --speculative-num-draft-tokens 1" + tp);
    ASSERT_EQ(r.exit_code, 0) << tp << ": " << r.err;
    const json out = json::parse(r.out);
    EXPECT_EQ(out["output_ids"].get<std::vector<int>>(), expected) << tp;
    EXPECT_GT(out["speculative"]["draft_tokens"].get<int>(), 0) << tp;
  }
}

// --batch-invariant: the CPU backend always is, so the flag leaves its
// greedy tokens (transformers' here) as they are, with drafts too; with
// --fp8-compute w8a8 it is refused on every command that takes it, naming
// both flags.
TEST(Cli, BatchInvariantFlag) {
  const json ref = read_json(kModels + "deepseek_v3/reference.json");
  const std::vector<int> prompt = ref["greedy_prompt"];
  const std::vector<int> expected(ref["greedy_output"].begin(), ref["greedy_output"].begin() + 8);
  const std::string model = " --model " + kModels + "deepseek_v3";
  for (const std::string& extra :
       {std::string(), std::string(" --speculative-algorithm mtp --speculative-num-draft-tokens 2")}) {
    const CliRun r = run("generate" + model + " --prompt-ids " + join(prompt) +
                         " --max-tokens 8 --temperature 0 --ignore-eos --json --batch-invariant" + extra);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json::parse(r.out)["output_ids"].get<std::vector<int>>(), expected) << extra;
  }
  for (const std::string& command :
       {"generate" + model + " --prompt-ids 1,2 --max-tokens 2", "serve" + model + " --port 0"}) {
    SCOPED_TRACE(command);
    CliRun r = run(command + " --batch-invariant --fp8-compute w8a8");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("--batch-invariant --fp8-compute w8a8"), std::string::npos) << r.err;
    r = run(command + " --batch-invariant --tp 2 --device cuda");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("--batch-invariant --tp N --device cuda"), std::string::npos) << r.err;
  }
}

// `basalt sim`: the bench trace on the H200 table, deterministic for a seed;
// a trace that cannot be served is refused.
TEST(Cli, Sim) {
  const std::string table = std::string(BASALT_SOURCE_DIR) + "/bench/sim/h200-llama8b.json";
  const std::string command = "sim --step-table " + table +
                              " --dataset shared-prefix --sp-groups 4 --sp-prompts-per-group 4 --request-rate 50 "
                              "--num-requests 400 --replicas 2 --seed 3 --json";
  CliRun r = run(command);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = json::parse(r.out);
  EXPECT_EQ(out["config"]["policy"], "cache-aware");
  EXPECT_EQ(out["results"]["requests"], 400);
  EXPECT_EQ(out["results"]["completed"], 400);
  EXPECT_GT(out["results"]["prefix_hit_rate"].get<double>(), 0.5);
  EXPECT_EQ(run(command).out, r.out);
  r = run("sim --step-table " + table + " --replicas 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--replicas 0 needs --autoscale"), std::string::npos) << r.err;
}

// `basalt deploy check`: the commented example is valid; a bad spec lists
// every problem as FILE:LINE: PATH: message and exits non-zero; --json.
TEST(Cli, DeployCheck) {
  CliRun r = run("deploy check " + std::string(BASALT_SOURCE_DIR) + "/deploy/basalt.yaml");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("ok: mini: 1-4 replicas of registry.example/basalt:0.1-cpu", 0), 0u) << r.out;
  const std::string bad = temp_path("bad_deploy.yaml");
  {
    std::ofstream out(bad);
    out << "name: Bad_Name\nimage: img\nmodel: {path: rel}\nreplicas: {min: 3, max: 1}\n";
  }
  r = run("deploy check " + bad);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(bad + ":1: name: 'Bad_Name' is not a lowercase DNS label"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(bad + ":3: model.path:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(bad + ":4: replicas.max: 1 is below replicas.min (3)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("3 problems"), std::string::npos) << r.err;
  r = run("deploy check --json " + bad);
  EXPECT_NE(r.exit_code, 0);
  const json out = json::parse(r.out);
  EXPECT_EQ(out["ok"], false);
  ASSERT_EQ(out["errors"].size(), 3u);
  EXPECT_EQ(out["errors"][2]["path"], "replicas.max");
  EXPECT_EQ(out["errors"][2]["line"], 4);
  r = run("deploy check " + temp_path("no_such_spec.yaml"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("cannot open"), std::string::npos) << r.err;
}

TEST(Cli, DeployRender) {
  const std::string spec = std::string(BASALT_SOURCE_DIR) + "/deploy/basalt.yaml";
  CliRun r = run("deploy render --namespace serving " + spec);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Seven documents: the engine's Deployment, Service and budget, the
  // gateway's, and the ScaledObject (the example autoscales 1-4).
  size_t documents = 0;
  for (size_t at = r.out.find("---\n"); at != std::string::npos; at = r.out.find("---\n", at + 1))
    ++documents;
  EXPECT_EQ(documents, 7u) << r.out;
  EXPECT_NE(r.out.find("kind: ScaledObject"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("namespace: serving"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("- --model\n"), std::string::npos) << r.out;
  r = run("deploy render --autoscaler hpa " + spec);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("kind: HorizontalPodAutoscaler"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("kind: ScaledObject"), std::string::npos) << r.out;
  const std::string out_dir = temp_path("deploy_render_out");
  std::filesystem::remove_all(out_dir);
  r = run("deploy render --out " + out_dir + " " + spec);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(out_dir + "/deployment-mini-engine.yaml")) << r.out;
  EXPECT_TRUE(std::filesystem::exists(out_dir + "/scaledobject-mini-engine.yaml")) << r.out;
  std::filesystem::remove_all(out_dir);
  // Refused: a bad namespace, an unknown autoscaler, a spec with errors.
  r = run("deploy render --namespace Serving " + spec);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--namespace: 'Serving' is not a lowercase DNS label"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(run("deploy render --autoscaler vpa " + spec).exit_code, 0);
  const std::string bad = temp_path("bad_render.yaml");
  {
    std::ofstream out(bad);
    out << "name: a\nimage: img\nmodel: {path: /m}\nreplicas: {min: 0, max: 2}\n";
  }
  r = run("deploy render --autoscaler hpa " + bad);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(bad + ": replicas.min: 0 (scale to zero) needs --autoscaler keda"),
            std::string::npos)
      << r.err;
}

TEST(Cli, EvalKlOfAnFp8CopyMatchesTheLogitsOfBothModels) {
  // KL(P_reference || P_candidate) with the bf16 checkpoint as the reference
  // and its block-FP8 copy as the candidate, averaged over the scored
  // positions, recomputed here from the logits each model gives on its own.
  const std::string src = kModels + "deepseek_v3", fp8 = temp_path("kl_fp8");
  std::filesystem::remove_all(fp8);
  CliRun r = run("quantize --model " + src + " --out " + fp8 + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string ref_file = kModels + "deepseek_v3/reference.safetensors";
  for (const std::string& prompt : {std::string("prompt_1"), std::string("prompt_2")}) {
    const std::vector<int32_t> raw = read_safetensor<int32_t>(ref_file, prompt + ".ids");
    const size_t n = raw.size();
    const std::string ids = " --ids " + join(std::vector<int>(raw.begin(), raw.end()));
    const std::string src_logits = temp_path("src.f32"), fp8_logits = temp_path("fp8.f32");
    // f32 activations: the bf16 reference's logits are compared with transformers' f32 ones below.
    ASSERT_EQ(run("eval --model " + src + ids + " --logits-out " + src_logits + " --dtype float32").exit_code, 0);
    ASSERT_EQ(run("eval --model " + fp8 + ids + " --logits-out " + fp8_logits + " --dtype float32").exit_code, 0);
    const std::vector<float> p = read_floats(src_logits), q = read_floats(fp8_logits);
    std::filesystem::remove(src_logits);
    std::filesystem::remove(fp8_logits);
    ASSERT_EQ(p.size(), q.size());
    const size_t vocab = p.size() / (n - 1);
    ASSERT_EQ(vocab, 320u);
    // The reference model's scored logits are transformers'.
    const std::vector<float> hf = read_safetensor<float>(ref_file, prompt + ".logits");
    for (size_t i = 0; i < p.size(); ++i) ASSERT_NEAR(p[i], hf[i], 1e-3) << i;

    double kl = 0, nll_p = 0;
    size_t agree = 0;
    for (size_t t = 0; t + 1 < n; ++t) {
      const std::vector<double> lp = log_probs(p.data() + t * vocab, vocab), lq = log_probs(q.data() + t * vocab, vocab);
      for (size_t v = 0; v < vocab; ++v) kl += std::exp(lp[v]) * (lp[v] - lq[v]);
      nll_p -= lp[static_cast<size_t>(raw[t + 1])];
      agree += arg_max(p.data() + t * vocab, vocab) == arg_max(q.data() + t * vocab, vocab);
    }
    kl /= static_cast<double>(n - 1);
    r = run("eval --model " + fp8 + " --compare-model " + src + ids + " --json --dtype float32");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json out = json::parse(r.out);
    EXPECT_GT(kl, 0.0);
    EXPECT_LT(kl, 0.05);
    EXPECT_NEAR(out["kl_mean"].get<double>(), kl, 1e-9 * kl) << prompt;
    EXPECT_EQ(out["top1_agreement"].get<double>(), static_cast<double>(agree) / static_cast<double>(n - 1));
    EXPECT_NEAR(out["reference_perplexity"].get<double>(), std::exp(nll_p / static_cast<double>(n - 1)), 1e-9);
    // Swapping the roles gives the other direction's KL, also positive.
    const json back =
        json::parse(run("eval --model " + src + " --compare-model " + fp8 + ids + " --json --dtype float32").out);
    EXPECT_GT(back["kl_mean"].get<double>(), 0.0);
    EXPECT_EQ(back["perplexity"], out["reference_perplexity"]);
  }
  std::filesystem::remove_all(fp8);
}

TEST(Cli, EvalMtpTop1MatchesTheReferenceMtpLogits) {
  // The fixture's MTP reference: transformers' main model hidden states over
  // mtp.ids and the MTP layer given mtp.next_ids (= mtp.ids shifted by one).
  // Row i depends only on tokens 0..i+1, so the sequence may be cut and its
  // last token changed: ids[0..4] + argmax(row 3) makes row 3 right.
  const std::string dir = kModels + "deepseek_v3";
  const std::string ref = dir + "/reference.safetensors";
  const std::vector<int32_t> ids = read_safetensor<int32_t>(ref, "mtp.ids");
  const std::vector<int32_t> next = read_safetensor<int32_t>(ref, "mtp.next_ids");
  const std::vector<float> mtp_logits = read_safetensor<float>(ref, "mtp.logits");
  ASSERT_EQ(ids.size(), 7u);
  const size_t vocab = mtp_logits.size() / ids.size();
  std::vector<int> seq(ids.begin(), ids.begin() + 5);
  ASSERT_EQ(next[3], seq[4]);
  seq.push_back(static_cast<int>(arg_max(mtp_logits.data() + 3 * vocab, vocab)));
  size_t hits = 0;
  for (size_t i = 0; i + 2 < seq.size(); ++i)
    hits += arg_max(mtp_logits.data() + i * vocab, vocab) == static_cast<size_t>(seq[i + 2]);
  ASSERT_GE(hits, 1u);
  CliRun r = run("eval --model " + dir + " --ids " + join(seq) + " --mtp --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json out = json::parse(r.out);
  EXPECT_EQ(out["mtp_tokens"], seq.size() - 2);
  EXPECT_EQ(out["mtp_top1"].get<double>(), static_cast<double>(hits) / static_cast<double>(seq.size() - 2));
  // --mtp leaves the main model's figures as they are.
  const json plain = json::parse(run("eval --model " + dir + " --ids " + join(seq) + " --json").out);
  EXPECT_EQ(out["perplexity"], plain["perplexity"]);
  EXPECT_EQ(out["top1"], plain["top1"]);

  // Across windows every position with a token two ahead counts once: the
  // 8 tokens in windows of 3 give 7 scored tokens and 6 MTP predictions.
  std::vector<int> all(ids.begin(), ids.end());
  all.push_back(next.back());
  r = run("eval --model " + dir + " --ids " + join(all) + " --mtp --context 3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  out = json::parse(r.out);
  EXPECT_EQ(out["tokens"], 7);
  EXPECT_EQ(out["mtp_tokens"], 6);
  // The fp8 checkpoint has an MTP layer too; a Llama has none.
  r = run("eval --model " + kModels + "deepseek_v3_fp8 --ids " + join(all) + " --mtp --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["mtp_tokens"], 6);
}

TEST(Cli, EvalIdsFileAndCompareModelTokenizers) {
  const std::vector<int32_t> raw =
      read_safetensor<int32_t>(kModels + "llama/reference.safetensors", "prompt_2.ids");
  const std::vector<int> ids(raw.begin(), raw.end());
  const std::string ids_file = temp_path("ids.txt");
  {
    std::ofstream out(ids_file);
    for (size_t i = 0; i < ids.size(); ++i) out << ids[i] << (i % 5 == 4 ? ",\n" : " ");
  }
  const std::string model = " --model " + kModels + "llama";
  const CliRun a = run("eval" + model + " --ids-file " + ids_file + " --json");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  json from_file = json::parse(a.out);
  json from_flag = json::parse(run("eval" + model + " --ids " + join(ids) + " --json").out);
  from_file.erase("tokens_per_second");
  from_flag.erase("tokens_per_second");
  EXPECT_EQ(from_file, from_flag);
  std::filesystem::remove(ids_file);

  // A text file is encoded by both tokenizers, which must agree.
  const std::string text_file = temp_path("compare.txt");
  std::ofstream(text_file) << "Basalt is a dark, fine-grained volcanic rock.";
  CliRun r = run("eval" + model + " --compare-model " + kModels + "llama --text-file " + text_file + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["kl_mean"].get<double>(), 0.0);
  // The same model whose tokenizer adds no BOS.
  const std::string no_bos = temp_path("no_bos");
  std::filesystem::remove_all(no_bos);
  std::filesystem::copy(kModels + "llama", no_bos);
  json tokenizer = read_json(no_bos + "/tokenizer.json");
  tokenizer["post_processor"] = nullptr;
  std::ofstream(no_bos + "/tokenizer.json") << tokenizer.dump();
  r = run("eval" + model + " --compare-model " + no_bos + " --text-file " + text_file + " --json");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("encode the text differently"), std::string::npos) << r.err;
  r = run("eval" + model + " --compare-model " + no_bos + " --ids 0,35,284 --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::filesystem::remove_all(no_bos);
  r = run("eval" + model + " --compare-model " + std::string(BASALT_TESTDATA) +
          "/../models/basalt-draft --ids 1,2,3 --json");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("vocabularies differ"), std::string::npos) << r.err;
  r = run("eval" + model + " --ids 1,2,3 --mtp");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no multi-token-prediction layer"), std::string::npos) << r.err;
  std::filesystem::remove(text_file);
}

// int8 / int4 copies of a dense model with tied embeddings (qwen2) and of a
// DeepSeek model: the engine generates with them on the CPU, and eval
// --compare-model reports what they cost against the original.
TEST(Cli, QuantizeWritesIntegerCopiesTheCpuRuns) {
  for (const auto& [model, format, group] :
       {std::tuple{"qwen2", "int8", "32"}, {"qwen2", "int4", "channel"}, {"deepseek_v3", "int4", "64"}}) {
    SCOPED_TRACE(std::string(model) + " " + format + " " + group);
    const std::string out_dir = temp_path(std::string(model) + "_" + format);
    std::filesystem::remove_all(out_dir);
    const std::string src = kModels + model;
    CliRun r = run("quantize --model " + src + " --out " + out_dir + " --format " + format + " --group-size " + group);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(std::string("to ") + format + " with"), std::string::npos) << r.out;
    const json q = read_json(out_dir + "/config.json")["quantization_config"];
    EXPECT_EQ(q["quant_method"], "basalt-int");
    EXPECT_EQ(q["bits"], format == std::string("int8") ? 8 : 4);
    EXPECT_EQ(q["group_size"], group == std::string("channel") ? -1 : std::stoi(group));

    const json ref = read_json(src + "/reference.json");
    const std::vector<int> prompt = ref["greedy_prompt"];
    r = run("generate --model " + out_dir + " --prompt-ids " + join(prompt) +
            " --max-tokens 6 --temperature 0 --ignore-eos --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json::parse(r.out)["output_ids"].size(), 6u);
    const std::vector<int32_t> raw = read_safetensor<int32_t>(src + "/reference.safetensors", "prompt_2.ids");
    r = run("eval --model " + out_dir + " --compare-model " + src + " --ids " +
            join(std::vector<int>(raw.begin(), raw.end())) + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json e = json::parse(r.out);
    // These random fixtures' NLLs are large (tens of nats), so compare NLLs, not perplexities.
    EXPECT_NEAR(e["nll_mean"].get<double>() / std::log(e["reference_perplexity"].get<double>()), 1.0, 0.05)
        << e.dump();
    EXPECT_LT(e["kl_mean"].get<double>(), 0.1) << e.dump();
    std::filesystem::remove_all(out_dir);
  }
}

TEST(Cli, QuantizeWritesAnFp8CopyTheEngineRuns) {
  const std::string out_dir = temp_path("fp8");
  std::filesystem::remove_all(out_dir);
  const std::string src = kModels + "deepseek_v3";
  CliRun r = run("quantize --model " + src + " --out " + out_dir + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json summary = json::parse(r.out);
  EXPECT_GT(summary["tensors_quantized"].get<int>(), 0);
  EXPECT_LT(summary["bytes_after"].get<double>(), summary["bytes_before"].get<double>());
  EXPECT_EQ(summary["files"], 2);
  EXPECT_EQ(read_json(out_dir + "/config.json")["quantization_config"]["weight_block_size"],
            json::array({128, 128}));
  EXPECT_TRUE(std::filesystem::exists(out_dir + "/model.safetensors.index.json"));

  // The copy generates, reports its FP8 weights, and scores the fixture
  // prompt close to the original (a few percent of perplexity on this model).
  const json ref = read_json(src + "/reference.json");
  const std::vector<int> prompt = ref["greedy_prompt"];
  r = run("generate --model " + out_dir + " --prompt-ids " + join(prompt) +
          " --max-tokens 8 --temperature 0 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["output_ids"].size(), 8u);
  EXPECT_NE(r.err.find("f8_e4m3"), std::string::npos) << r.err;
  const std::vector<int32_t> raw = read_safetensor<int32_t>(src + "/reference.safetensors", "prompt_2.ids");
  const std::string ids = " --ids " + join(std::vector<int>(raw.begin(), raw.end())) + " --json";
  const double original = json::parse(run("eval --model " + src + ids).out)["perplexity"];
  const double quantized = json::parse(run("eval --model " + out_dir + ids).out)["perplexity"];
  EXPECT_NEAR(quantized / original, 1.0, 0.1);

  // Plain summary; a second run needs --force.
  r = run("quantize --model " + src + " --out " + out_dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("not empty"), std::string::npos) << r.err;
  r = run("quantize --model " + src + " --out " + out_dir + " --force");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("quantized ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(" -> "), std::string::npos) << r.out;
  std::filesystem::remove_all(out_dir);
}

TEST(Cli, BadInputExitsNonZeroWithOneLine) {
  const std::string model = " --model " + kModels + "llama";
  const std::string empty_file = temp_path("empty.txt");
  std::ofstream(empty_file) << " \n";
  const std::string out_dir = temp_path("never_written");
  const std::string no_tokenizer = temp_path("no_tokenizer");
  std::filesystem::copy(kModels + "llama", no_tokenizer);
  std::filesystem::remove(no_tokenizer + "/tokenizer.json");
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
      "generate" + model + " --prompt x --repetition-penalty 0",
      "generate" + model + " --prompt x --frequency-penalty 2.5",
      "generate" + model + " --prompt x --presence-penalty -3",
      "generate" + model + " --prompt x --logit-bias 5",
      "generate" + model + " --prompt x --logit-bias 5:lots",
      "generate" + model + " --prompt x --logit-bias 400:1",
      "generate" + model + " --prompt x --logit-bias 3:101",
      "generate" + model + " --prompt x --stop ''",
      "generate" + model + " --prompt x --stop-token-ids 1,x",
      "generate" + model + " --prompt x --stop-token-ids 320",
      "generate" + model + " --prompt x --min-tokens -1",
      "generate" + model + " --prompt x --max-tokens 4 --min-tokens 5",
      "generate" + model + " --prompt x --n 0",
      "generate --model " + no_tokenizer + " --prompt-ids 1,2 --stop x",
      "tokenize" + model,
      "detokenize" + model + " --ids 1,2,100000",
      "frobnicate",
      "eval" + model,
      "eval" + model + " --text-file /nonexistent/text.txt",
      "eval" + model + " --text-file " + empty_file,
      "eval" + model + " --ids 5",
      "eval" + model + " --ids 1,2,3 --max-tokens 1",
      "eval" + model + " --ids 1,2,3 --context 1",
      "eval" + model + " --ids 1,2,3 --context 100000",
      "eval" + model + " --ids 1,2,99999",
      "quantize" + model + " --out " + out_dir,
      "quantize --model " + kModels + "deepseek_v3_fp8 --out " + out_dir,
      "quantize --model " + kModels + "deepseek_v3 --out " + out_dir + " --format int3",
      "quantize --model " + kModels + "llama --out " + out_dir + " --format int8 --group-size 48",
      "quantize --model " + kModels + "llama --out " + out_dir + " --format int4 --group-size rows",
      "quantize --model /nonexistent/model --out " + out_dir,
      "quantize --model " + kModels + "deepseek_v3",
      // A context longer than the model's is refused before anything loads.
      "serve --max-model-len 100000 --port 0",
      "serve --log-format xml --port 0",
      "serve --threads -2 --port 0",
      "serve --allowed-origins https://app.example.com/path --port 0",
      "BASALT_NUM_THREADS=lots generate" + model + " --prompt x",
      "generate" + model + " --prompt x --threads 99999",
  };
  for (const std::string& args : cases) {
    // A leading VAR=value goes in front of the binary.
    const size_t eq = args.find('=');
    const CliRun r = eq != std::string::npos && args.find(' ') > eq
                         ? run_with_env(args.substr(0, args.find(' ')), args.substr(args.find(' ') + 1))
                         : run(args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_EQ(r.out, "") << args;
    ASSERT_FALSE(r.err.empty()) << args;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << args << ": " << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(out_dir));
  std::filesystem::remove(empty_file);
  std::filesystem::remove_all(no_tokenizer);
}


// The bundled models (models/, trained by tools/train/train_bundled.py): the
// greedy continuations transformers produced for them when they were trained
// (models/reports/) are the reference, run in f32: so is Basalt here
// (--dtype float32; the default's bf16 activations are held to transformers
// in model/bundled_test.cc, to a bf16 tolerance).
const std::string kBundled = std::string(BASALT_TESTDATA) + "/../models/";

void expect_bundled_matches_transformers(const std::string& model, const std::string& report,
                                         const char* section, const std::string& flags = "") {
  const json samples = read_json(kBundled + "reports/" + report)[section]["samples"];
  ASSERT_FALSE(samples.empty());
  for (const json& sample : samples) {
    const std::vector<int> prompt = sample["prompt_ids"];
    const std::vector<int> expected = sample["output_ids"];
    const CliRun r = run("generate --model " + kBundled + model + " --prompt-ids " + join(prompt) +
                         " --max-tokens " + std::to_string(expected.size()) +
                         " --temperature 0 --ignore-eos --json --dtype float32" + flags);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json::parse(r.out)["output_ids"].get<std::vector<int>>(), expected)
        << model << flags << ": " << sample["prompt"];
  }
}

// --dtype: bf16 weights meet bf16-rounded activations with bfloat16 and f32
// ones with float32; eval compares the two on the same model
// (--compare-dtype), a small but real difference, and says which one auto
// took on this build (bfloat16 where it has AVX-512 BF16, float32
// elsewhere); bad values and float32 on a GPU are refused, naming the flag,
// on every command that takes it.
TEST(Cli, DtypeChoosesWhatBf16WeightsMultiplyWith) {
  const std::string model = " --model " + kBundled + "basalt-mini";
  const std::string ids = " --ids " + join(std::vector<int>{0, 74, 613, 349, 4805, 1871, 305, 270, 3187, 617, 3187, 16,
                                                              270, 3187, 1141, 1547, 4091, 203, 3168, 270});
  CliRun r = run("eval" + model + ids + " --dtype bfloat16 --compare-model " + kBundled +
                 "basalt-mini --compare-dtype float32 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json out = json::parse(r.out);
  EXPECT_EQ(out["dtype"], "bfloat16");
  EXPECT_EQ(out["activations"], "bfloat16");
  EXPECT_EQ(out["compare_dtype"], "float32");
  EXPECT_GT(out["kl_mean"].get<double>(), 0.0);
  EXPECT_LT(out["kl_mean"].get<double>(), 1e-2);
  EXPECT_NEAR(out["perplexity"].get<double>() / out["reference_perplexity"].get<double>(), 1.0, 0.01);
  r = run("eval" + model + ids + " --dtype float32 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["perplexity"], out["reference_perplexity"]);
  EXPECT_EQ(json::parse(r.out)["activations"], "float32");
  // auto is one of the two, exactly, and says which.
  r = run("eval" + model + ids + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json automatic = json::parse(r.out);
  EXPECT_EQ(automatic["dtype"], "auto");
  EXPECT_EQ(automatic["perplexity"],
            automatic["activations"] == "bfloat16" ? out["perplexity"] : out["reference_perplexity"])
      << automatic;
  r = run("eval" + model + ids + " --compare-dtype float32");
  EXPECT_NE(r.err.find("--compare-dtype needs --compare-model"), std::string::npos) << r.err;
  for (const std::string& command : {"eval" + model + ids, "generate" + model + " --prompt-ids 1,2 --max-tokens 2",
                                    "serve" + model + " --port 0"}) {
    SCOPED_TRACE(command);
    r = run(command + " --dtype float16");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("--dtype float16: expected auto, bfloat16 or float32"), std::string::npos) << r.err;
    r = run(command + " --dtype float32 --device cuda");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("--dtype float32 --device cuda"), std::string::npos) << r.err;
  }
}

TEST(Cli, BundledMainModelMatchesTransformersGreedy) {
  expect_bundled_matches_transformers("basalt-mini", "run2-mini.json", "main_transformers");
}

TEST(Cli, BundledDraftModelMatchesTransformersGreedy) {
  expect_bundled_matches_transformers("basalt-draft", "run1-tokenizer-draft.json",
                                      "draft_transformers");
}

// --tp: the draft model (Llama layout, 4 heads, 2 key/value heads) over 2
// and 4 CPU ranks, and the main model (DeepSeek layout, 8 heads, 16
// experts) over 2, give transformers' tokens too; what cannot be sharded
// is refused, naming why.
TEST(Cli, TensorParallelGenerateMatchesTransformersGreedy) {
  expect_bundled_matches_transformers("basalt-draft", "run1-tokenizer-draft.json", "draft_transformers", " --tp 2");
  expect_bundled_matches_transformers("basalt-draft", "run1-tokenizer-draft.json", "draft_transformers",
                                      " --tp 4 --threads 2");
  expect_bundled_matches_transformers("basalt-mini", "run2-mini.json", "main_transformers", " --tp 2");
  // DeepSeek's MTP layer drafts over the ranks too: transformers' tokens,
  // and the drafts and acceptances of one rank.
  expect_bundled_matches_transformers("basalt-mini", "run2-mini.json", "main_transformers",
                                      " --tp 2 --speculative-algorithm mtp");
  const std::string mtp = "generate --model " + kBundled +
                          "basalt-mini --prompt 'The Debian project' --max-tokens 40 --temperature 0 --ignore-eos "
                          "--json --speculative-algorithm mtp";
  const CliRun one_rank = run(mtp), two_ranks = run(mtp + " --tp 2");
  ASSERT_EQ(one_rank.exit_code, 0) << one_rank.err;
  ASSERT_EQ(two_ranks.exit_code, 0) << two_ranks.err;
  const json a = json::parse(one_rank.out), b = json::parse(two_ranks.out);
  EXPECT_EQ(a["text"], b["text"]);
  EXPECT_GT(a["speculative"]["accepted_tokens"].get<int>(), 0);
  EXPECT_EQ(a["speculative"], b["speculative"]);
  const CliRun heads = run("generate --model " + kBundled + "basalt-draft --prompt-ids 1,2,3 --tp 3");
  EXPECT_NE(heads.exit_code, 0);
  EXPECT_NE(heads.err.find("num_attention_heads (4) must divide by it"), std::string::npos) << heads.err;
  const CliRun zero = run("generate --model " + kBundled + "basalt-draft --prompt-ids 1,2,3 --tp 0");
  EXPECT_NE(zero.err.find("--tp must be in [1, 64]"), std::string::npos) << zero.err;
}

// A free TCP port of the loopback interface (bound, read, released).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// `generate ARGS` as node 0 of two, node 1 running `serve` with the same
// model and rank flags (PARALLEL) beside it; node 1's run in *worker.
CliRun generate_over_two_nodes(const std::string& model, const std::string& parallel, const std::string& args,
                               CliRun* worker) {
  const std::string nodes =
      parallel + " --nnodes 2 --dist-init-addr 127.0.0.1:" + std::to_string(free_port()) + " --dist-timeout 60";
  std::thread node1([&] { *worker = run("serve --model " + model + nodes + " --node-rank 1"); });
  CliRun leader = run("generate --model " + model + nodes + " --node-rank 0" + args);
  node1.join();
  return leader;
}

// --nnodes 2: the --tp ranks over two processes linked by TCP, as over two
// machines; node 0 generates, node 1 (`serve --node-rank 1`) runs its ranks
// and stops with it. The dense draft model (a rank a node, and two) and
// the DeepSeek main model (its MTP layer drafting over the nodes too) give
// transformers' greedy tokens, and the same drafts and acceptances as one
// process; what cannot run is refused, naming the flag, and a node running
// another model is turned away.
TEST(Cli, TensorParallelOverNodesMatchesTransformers) {
  struct Run {
    std::string model, report, section, parallel;
  };
  for (const Run& r : {Run{"basalt-draft", "run1-tokenizer-draft.json", "draft_transformers", " --tp 2"},
                       Run{"basalt-draft", "run1-tokenizer-draft.json", "draft_transformers", " --tp 4 --threads 2"},
                       Run{"basalt-mini", "run2-mini.json", "main_transformers", " --tp 2"}}) {
    const json sample = read_json(kBundled + "reports/" + r.report)[r.section]["samples"][0];
    const std::vector<int> prompt = sample["prompt_ids"], expected = sample["output_ids"];
    CliRun worker;
    const CliRun leader = generate_over_two_nodes(
        kBundled + r.model, r.parallel,
        " --prompt-ids " + join(prompt) + " --max-tokens " + std::to_string(expected.size()) +
            " --temperature 0 --ignore-eos --json --dtype float32",
        &worker);
    ASSERT_EQ(leader.exit_code, 0) << r.model << r.parallel << ": " << leader.err << "\nnode 1: " << worker.err;
    EXPECT_EQ(json::parse(leader.out)["output_ids"].get<std::vector<int>>(), expected) << r.model << r.parallel;
    EXPECT_EQ(worker.exit_code, 0) << worker.err;
    EXPECT_NE(worker.err.find("stopped=\"the leader stopped\""), std::string::npos) << worker.err;
    EXPECT_NE(leader.err.find("over 2 nodes (this is node 0, the leader)"), std::string::npos) << leader.err;
  }
  const std::string mtp = " --prompt 'The Debian project' --max-tokens 40 --temperature 0 --ignore-eos --json "
                          "--speculative-algorithm mtp";
  const CliRun one = run("generate --model " + kBundled + "basalt-mini --tp 2" + mtp);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  CliRun worker;
  const CliRun nodes = generate_over_two_nodes(kBundled + "basalt-mini", " --tp 2", mtp, &worker);
  ASSERT_EQ(nodes.exit_code, 0) << nodes.err << "\nnode 1: " << worker.err;
  EXPECT_EQ(json::parse(one.out)["text"], json::parse(nodes.out)["text"]);
  EXPECT_GT(json::parse(nodes.out)["speculative"]["accepted_tokens"].get<int>(), 0);
  EXPECT_EQ(json::parse(one.out)["speculative"], json::parse(nodes.out)["speculative"]);

  const std::pair<std::string, std::string> refusals[] = {
      {" --tp 2 --nnodes 2", "--nnodes 2: give --dist-init-addr HOST:PORT"},
      {" --tp 3 --nnodes 2 --dist-init-addr 127.0.0.1:1", "give a --tp that --nnodes divides"},
      {" --tp 2 --nnodes 2 --node-rank 2 --dist-init-addr 127.0.0.1:1", "--node-rank 2 is not in [0, --nnodes 2)"},
      {" --tp 2 --nnodes 2 --dist-init-addr nowhere", "--dist-init-addr 'nowhere': give HOST:PORT"},
      {" --tp 2 --nnodes 2 --dp-attention --dist-init-addr 127.0.0.1:1", "DP attention runs over the ranks of one"},
      {" --tp 2 --nnodes 2 --dist-init-addr 127.0.0.1:" + std::to_string(free_port()) + " --dist-timeout 0.5",
       "nodes 1 of 2 did not join"},
  };
  for (const auto& [flags, message] : refusals) {
    const CliRun refused = run("generate --prompt-ids 1,2,3" + flags);
    EXPECT_NE(refused.exit_code, 0) << flags;
    EXPECT_NE(refused.err.find(message), std::string::npos) << flags << ": " << refused.err;
  }
  // A node running another model than node 0's is turned away with the reason.
  const std::string link = " --tp 2 --nnodes 2 --dist-timeout 5 --dist-init-addr 127.0.0.1:" + std::to_string(free_port());
  CliRun stranger;
  std::thread node1([&] { stranger = run("serve --model " + kBundled + "basalt-draft" + link + " --node-rank 1"); });
  const CliRun alone = run("generate --prompt-ids 1,2,3" + link);
  node1.join();
  EXPECT_NE(alone.exit_code, 0);
  EXPECT_NE(stranger.exit_code, 0);
  EXPECT_NE(stranger.err.find("refused node 1: it runs 'config.json"), std::string::npos) << stranger.err;
}

// --tp N --dp-attention: the main model (DeepSeek layout, 16 experts) over
// 2 and 4 DP-attention ranks gives transformers' tokens, by the exchange
// and by gathering, the dense MLPs and shared experts split over the ranks
// (gathering's default) or whole on each; a --batch of
// prompts spread over the ranks gives what one engine gives; what is not
// offered is refused, naming the flag.
TEST(Cli, DpAttentionGenerateMatchesOneEngine) {
  expect_bundled_matches_transformers("basalt-mini", "run2-mini.json", "main_transformers", " --tp 2 --dp-attention");
  expect_bundled_matches_transformers("basalt-mini", "run2-mini.json", "main_transformers",
                                      " --tp 4 --ep 4 --dp-attention --threads 2");
  expect_bundled_matches_transformers("basalt-mini", "run2-mini.json", "main_transformers",
                                      " --tp 2 --dp-attention --dp-moe gather");
  expect_bundled_matches_transformers("basalt-mini", "run2-mini.json", "main_transformers",
                                      " --tp 4 --dp-attention --dp-moe gather --threads 2");
  expect_bundled_matches_transformers("basalt-mini", "run2-mini.json", "main_transformers",
                                      " --tp 2 --dp-attention --dp-moe gather --moe-dense-tp-size 1");
  // Two DP groups of 2 ranks, each splitting its attention heads (SGLang's
  // --dp below --tp), both ways to the experts.
  expect_bundled_matches_transformers("basalt-mini", "run2-mini.json", "main_transformers",
                                      " --tp 4 --dp 2 --dp-attention --threads 2");
  expect_bundled_matches_transformers("basalt-mini", "run2-mini.json", "main_transformers",
                                      " --tp 4 --dp 2 --dp-attention --dp-moe gather --threads 2");
  const CliRun split = run("generate --prompt-ids 1,2,3 --max-tokens 2 --tp 2 --dp-attention --dp-moe gather");
  EXPECT_NE(split.err.find("dense MLPs and shared experts split over the 2 ranks"), std::string::npos) << split.err;
  const CliRun groups = run("generate --prompt-ids 1,2,3 --max-tokens 2 --tp 4 --dp 2 --dp-attention --threads 2");
  EXPECT_NE(groups.err.find("DP attention over 2 ranks (this is rank 0, its attention heads over 2 ranks), experts "
                            "by the exchange, dense MLPs and shared experts split over its 2 ranks"),
            std::string::npos)
      << groups.err;
  const std::string batch = temp_path("dp_batch.jsonl");
  {
    std::ofstream out(batch);
    for (const char* prompt : {"The Debian project", "Free software is", "A compiler turns", "On a cold morning",
                               "The river"})
      out << json{{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}}.dump() << "\n";
  }
  const CliRun one = run("generate --batch " + batch + " --json");
  const CliRun ranks = run("generate --batch " + batch + " --json --tp 2 --dp-attention");
  std::filesystem::remove(batch);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(ranks.exit_code, 0) << ranks.err;
  // Line by line (seeds, which greedy does not use, and cached prompt
  // tokens, which depend on the rank a request met, may differ).
  std::istringstream want(one.out), got(ranks.out);
  std::string a, b;
  int lines = 0;
  while (std::getline(want, a)) {
    ASSERT_TRUE(std::getline(got, b)) << ranks.out;
    EXPECT_EQ(json::parse(a)["output_ids"], json::parse(b)["output_ids"]) << a << "\n" << b;
    EXPECT_EQ(json::parse(a)["text"], json::parse(b)["text"]);
    ++lines;
  }
  EXPECT_EQ(lines, 5);
  EXPECT_NE(ranks.err.find("DP attention over 2 ranks"), std::string::npos) << ranks.err;
  // n-gram drafts over the ranks: transformers' tokens, and the drafts and
  // acceptances of one engine (a request's drafts depend on its tokens alone).
  expect_bundled_matches_transformers("basalt-mini", "run2-mini.json", "main_transformers",
                                      " --tp 2 --dp-attention --speculative-algorithm ngram");
  const std::string ngram = "generate --prompt 'one two three one two three one two' --max-tokens 24 "
                            "--temperature 0 --ignore-eos --json --speculative-algorithm ngram";
  const CliRun ngram_one = run(ngram), ngram_ranks = run(ngram + " --tp 2 --dp-attention");
  ASSERT_EQ(ngram_one.exit_code, 0) << ngram_one.err;
  ASSERT_EQ(ngram_ranks.exit_code, 0) << ngram_ranks.err;
  const json one_engine = json::parse(ngram_one.out), over_ranks = json::parse(ngram_ranks.out);
  EXPECT_EQ(one_engine["text"], over_ranks["text"]);
  EXPECT_GT(over_ranks["speculative"]["draft_tokens"].get<int>(), 0) << ngram_ranks.out;
  EXPECT_EQ(one_engine["speculative"], over_ranks["speculative"]);
  // The MTP layer drafts over the ranks too, its passes meeting in the
  // expert exchanges: transformers' tokens, and one engine's drafts and
  // acceptances, over 2 and 4 ranks.
  expect_bundled_matches_transformers("basalt-mini", "run2-mini.json", "main_transformers",
                                      " --tp 2 --dp-attention --speculative-algorithm mtp");
  const std::string mtp = "generate --prompt 'The Debian project' --max-tokens 40 --temperature 0 --ignore-eos "
                          "--json --speculative-algorithm mtp";
  const CliRun mtp_one = run(mtp);
  ASSERT_EQ(mtp_one.exit_code, 0) << mtp_one.err;
  const json mtp_engine = json::parse(mtp_one.out);
  EXPECT_GT(mtp_engine["speculative"]["accepted_tokens"].get<int>(), 0);
  for (const char* flags :
       {" --tp 2 --dp-attention", " --tp 4 --dp-attention --threads 2", " --tp 4 --dp 2 --dp-attention --threads 2"}) {
    const CliRun mtp_ranks = run(mtp + flags);
    ASSERT_EQ(mtp_ranks.exit_code, 0) << flags << ": " << mtp_ranks.err;
    const json got = json::parse(mtp_ranks.out);
    EXPECT_EQ(mtp_engine["text"], got["text"]) << flags;
    EXPECT_EQ(mtp_engine["speculative"], got["speculative"]) << flags;
  }
  const std::pair<std::string, std::string> refusals[] = {
      {" --tp 2 --ep 4", "--ep 4: the routed experts are split over the --tp ranks (2)"},
      {" --dp-attention", "--dp-attention runs over the --tp ranks: give --tp 2 or more"},
      {" --tp 2 --dp-attention --speculative-algorithm eagle", "EAGLE heads and draft models do not run over"},
      {" --tp 2 --dp-attention --model " + kBundled + "basalt-draft", "DP attention is for DeepSeek"},
      {" --tp 2 --dp-moe gather", "--dp-moe gather applies to --dp-attention only"},
      {" --tp 2 --dp-attention --dp-moe scatter", "--dp-moe"},
      {" --tp 2 --moe-dense-tp-size 2", "--moe-dense-tp-size applies to --dp-attention only"},
      {" --tp 2 --dp-attention --moe-dense-tp-size 2", "runs with --dp-moe gather only"},
      {" --tp 4 --dp-attention --dp-moe gather --moe-dense-tp-size 2",
       "split over every --tp rank (4) or over each DP group's ranks (1: held whole)"},
      {" --tp 4 --dp 2 --dp-attention --moe-dense-tp-size 1", "or over each DP group's ranks (2, --tp / --dp)"},
      {" --tp 4 --dp 2", "--dp 2 applies to --dp-attention only"},
      {" --tp 4 --dp 3 --dp-attention", "give a --dp that divides --tp"},
      {" --tp 4 --dp 1 --dp-attention", "one group is tensor parallelism"},
      {" --tp 4 --dp 8 --dp-attention", "--dp 8: DP attention makes 2 to --tp (4) groups"},
      {" --tp 2 --dp-attention --dp-moe gather --moe-dense-tp-size 0", "--moe-dense-tp-size"},
  };
  for (const auto& [flags, message] : refusals) {
    const CliRun r = run("generate --prompt-ids 1,2,3" + flags);
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_NE(r.err.find(message), std::string::npos) << flags << ": " << r.err;
  }
}

// --random-weights: a directory with config.json alone (the bundled
// model's) runs, over ranks too; without the flag it has no weights.
TEST(Cli, RandomWeightsNeedOnlyAConfig) {
  const std::string dir = temp_path("config_only");
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kBundled + "basalt-mini/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  for (const char* flags : {"", " --tp 2", " --tp 2 --dp-attention"}) {
    const CliRun r = run("generate --model " + dir + " --random-weights --prompt-ids 1,2,3 --max-tokens 3 "
                         "--temperature 0 --ignore-eos --json" + std::string(flags));
    ASSERT_EQ(r.exit_code, 0) << flags << ": " << r.err;
    EXPECT_EQ(json::parse(r.out)["output_ids"].size(), 3u) << flags;
  }
  const CliRun without = run("generate --model " + dir + " --prompt-ids 1,2,3 --max-tokens 3");
  std::filesystem::remove_all(dir);
  EXPECT_NE(without.exit_code, 0);
  EXPECT_NE(without.err.find("safetensors"), std::string::npos) << without.err;
}

TEST(Cli, WithoutModelFlagUsesTheBundledModel) {
  const std::string args = " --prompt 'The Debian project' --max-tokens 12 --temperature 0.7 --seed 3 --json";
  const CliRun implicit = run("generate" + args);
  const CliRun explicit_model = run("generate --model " + kBundled + "basalt-mini" + args);
  ASSERT_EQ(implicit.exit_code, 0) << implicit.err;
  ASSERT_EQ(explicit_model.exit_code, 0) << explicit_model.err;
  EXPECT_EQ(json::parse(implicit.out)["output_ids"], json::parse(explicit_model.out)["output_ids"]);
  // Stable across runs, and the text is the model's English, not byte soup.
  EXPECT_EQ(json::parse(run("generate" + args).out)["text"], json::parse(implicit.out)["text"]);
  const std::string text = json::parse(implicit.out)["text"];
  size_t letters = 0;
  for (char c : text) letters += std::isalpha(static_cast<unsigned char>(c)) || c == ' ';
  EXPECT_GT(letters, text.size() * 8 / 10) << text;
  const CliRun tokens = run("tokenize --text 'The Debian project' --json");
  ASSERT_EQ(tokens.exit_code, 0) << tokens.err;
  EXPECT_FALSE(json::parse(tokens.out)["ids"].empty());
  // eval too, like every other command.
  const std::string text_file = temp_path("bundled_eval.txt");
  std::ofstream(text_file) << "The Debian project makes a free operating system.";
  const CliRun eval_implicit = run("eval --text-file " + text_file + " --json");
  const CliRun eval_explicit = run("eval --model " + kBundled + "basalt-mini --text-file " + text_file + " --json");
  std::filesystem::remove(text_file);
  ASSERT_EQ(eval_implicit.exit_code, 0) << eval_implicit.err;
  ASSERT_EQ(eval_explicit.exit_code, 0) << eval_explicit.err;
  EXPECT_EQ(json::parse(eval_implicit.out)["perplexity"], json::parse(eval_explicit.out)["perplexity"]);
}

TEST(Cli, VersionHelpAndThreads) {
  const CliRun version = run("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_TRUE(version.out.rfind("basalt ", 0) == 0) << version.out;
  for (const char* command : {"generate", "tokenize", "detokenize", "quantize", "eval", "serve", "bench"}) {
    const CliRun help = run(std::string(command) + " --help");
    EXPECT_EQ(help.exit_code, 0) << command;
    // Boolean flags show no "{false}" default.
    EXPECT_EQ(help.out.find("{false}"), std::string::npos) << command << ":\n" << help.out;
    EXPECT_EQ(help.out.find("{true}"), std::string::npos) << command << ":\n" << help.out;
  }
  const CliRun serve_help = run("serve --help");
  EXPECT_NE(serve_help.out.find("--threads"), std::string::npos);
  EXPECT_NE(serve_help.out.find("BASALT_NUM_THREADS"), std::string::npos);
  EXPECT_NE(serve_help.out.find("--log-format"), std::string::npos);
  // --threads and BASALT_NUM_THREADS give the same tokens as the default.
  const std::string args = "generate --prompt 'Free software' --max-tokens 6 --temperature 0 --json";
  const CliRun plain = run(args);
  const CliRun one = run(args + " --threads 1");
  const CliRun env = run_with_env("BASALT_NUM_THREADS=1", args);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(env.exit_code, 0) << env.err;
  EXPECT_EQ(json::parse(one.out)["output_ids"], json::parse(plain.out)["output_ids"]);
  EXPECT_EQ(json::parse(env.out)["output_ids"], json::parse(plain.out)["output_ids"]);
}


TEST(Cli, BundledModelFp8CopyStaysCloseToBf16) {
  // basalt quantize makes the block-FP8 copy; on real English its token
  // distributions must stay close to the bf16 model's.
  const auto dir = std::filesystem::temp_directory_path() /
                   ("basalt_bundled_fp8_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::string mini = kBundled + "basalt-mini";
  CliRun r = run("quantize --model " + mini + " --out " + dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto text = dir / "sample.txt";
  std::ofstream(text) << "The Debian project produces a free operating system. Packages are "
                         "installed with apt, which resolves their dependencies and downloads "
                         "them from a mirror. Each package has a maintainer who looks after it, "
                         "and bugs are reported to the Debian bug tracking system.\n";
  r = run("eval --model " + dir.string() + " --compare-model " + mini + " --text-file " +
          text.string() + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = json::parse(r.out);
  EXPECT_GT(out["kl_mean"].get<double>(), 0.0);
  EXPECT_LT(out["kl_mean"].get<double>(), 0.05);
  EXPECT_GT(out["top1_agreement"].get<double>(), 0.85);
  EXPECT_LT(std::fabs(std::log(out["perplexity"].get<double>() /
                               out["reference_perplexity"].get<double>())), 0.05);
  std::filesystem::remove_all(dir);
}

}  // namespace

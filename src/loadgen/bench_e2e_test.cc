// End to end: the real `basalt serve` on a free port, driven by the real
// `basalt bench`, both as a user would run them (BASALT_BINARY); the JSON
// report is checked against what was asked. `basalt bench --cold-start`
// starts its own servers: its report's shape is checked, and that every
// run's phases are positive and in start order (no timing thresholds).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class Server {
 public:
  explicit Server(const std::vector<std::string>& extra) {
    dir_ = fs::temp_directory_path() / ("basalt_bench_e2e_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    log_ = dir_ / "server.log";
    std::vector<std::string> args = {BASALT_BINARY, "serve", "--port", "0", "--no-request-log"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    EXPECT_EQ(posix_spawn(&pid_, BASALT_BINARY, &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    // "... info listening url=http://127.0.0.1:PORT" (or https), then "... info ready".
    const std::string mark = "listening url=";
    for (int i = 0; i < 1200 && port_ == 0; ++i) {
      const std::string log = slurp(log_);
      const size_t at = log.find(mark);
      const size_t colon = at == std::string::npos ? at : log.find("127.0.0.1:", at);
      if (log.find(" info ready ") != std::string::npos && colon != std::string::npos) {
        scheme_ = log.substr(at + mark.size(), log.find("://", at) - at - mark.size());
        port_ = std::atoi(log.c_str() + colon + 10);
      }
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_NE(port_, 0) << slurp(log_);
  }
  ~Server() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    fs::remove_all(dir_);
  }
  std::string url() const { return scheme_ + "://127.0.0.1:" + std::to_string(port_); }
  const fs::path& dir() const { return dir_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string scheme_;
  fs::path dir_, log_;
};

struct BenchRun {
  int exit_code = -1;
  std::string out;
  json report;
};

BenchRun bench(const Server& server, const std::string& args) {
  const fs::path report = server.dir() / "report.json";
  const fs::path out = server.dir() / "bench.out";
  fs::remove(report);
  const std::string command = std::string(BASALT_BINARY) + " bench --base-url " + server.url() +
                              " --output-json " + report.string() + " " + args + " >" + out.string() + " 2>&1";
  BenchRun r;
  const int status = std::system(command.c_str());
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  if (fs::exists(report)) r.report = json::parse(slurp(report), nullptr, false);
  return r;
}

void expect_ordered(const json& s, const char* name) {
  EXPECT_LE(s["min"].get<double>(), s["median"].get<double>()) << name;
  EXPECT_LE(s["median"].get<double>(), s["p90"].get<double>()) << name;
  EXPECT_LE(s["p90"].get<double>(), s["p95"].get<double>()) << name;
  EXPECT_LE(s["p95"].get<double>(), s["p99"].get<double>()) << name;
  EXPECT_LE(s["p99"].get<double>(), s["max"].get<double>()) << name;
  EXPECT_GT(s["max"].get<double>(), 0) << name;
}

void expect_no_errors(const json& r) {
  EXPECT_EQ(r["failed"], 0);
  for (const char* k : {"connect", "http_status", "timeout", "stream"}) EXPECT_EQ(r["errors"][k], 0) << k;
}

TEST(BenchE2E, RandomWorkloadCountsExactlyTheAskedTokens) {
  Server server({});
  const fs::path svg = server.dir() / "report.svg";
  const BenchRun r = bench(server, "--num-prompts 12 --input-len 32 --output-len 16 --ignore-eos --request-rate 50 "
                                   "--seed 3 --slo-ttft-ms 60000 --slo-tpot-ms 60000 --save-detailed --output-svg " +
                                       svg.string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_TRUE(r.report.is_object()) << r.out;
  const json& res = r.report["results"][0];
  EXPECT_EQ(res["requests"], 12);
  EXPECT_EQ(res["completed"], 12);
  expect_no_errors(res);
  EXPECT_EQ(res["output_tokens"], 12 * 16);
  EXPECT_EQ(res["output_len"]["min"], 16);
  EXPECT_EQ(res["output_len"]["max"], 16);
  EXPECT_EQ(res["good_requests"], 12);
  for (const char* k : {"ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"}) expect_ordered(res[k], k);
  EXPECT_EQ(res["itl_ms"]["count"], 12 * 15);  // Basalt streams one token per event
  EXPECT_GT(res["client"]["cpu_s"].get<double>(), 0);
  EXPECT_NE(r.out.find("TTFT"), std::string::npos);
  EXPECT_NE(slurp(svg).find("</svg>"), std::string::npos);
  // --save-detailed: each request by its index in the trace, due in order.
  ASSERT_EQ(res["details"].size(), 12u) << res.dump();
  for (int i = 0; i < 12; ++i) {
    const json& d = res["details"][i];
    EXPECT_EQ(d["index"], i);
    EXPECT_EQ(d["output_tokens"], 16);
    EXPECT_EQ(d["error"], "");
    EXPECT_GT(d["ttft_ms"].get<double>(), 0);
    EXPECT_LE(d["ttft_ms"].get<double>(), d["e2e_ms"].get<double>());
    if (i > 0) {
      EXPECT_GE(d["scheduled_s"].get<double>(), res["details"][i - 1]["scheduled_s"].get<double>());
    }
  }
  // The server's speculation counters, scraped around the run: none drafted.
  ASSERT_TRUE(res["speculative"].is_object()) << res.dump();
  EXPECT_EQ(res["speculative"]["draft_tokens"], 0);
}

// Against a server that speculates, the report has the drafts of this run
// and their acceptance, next to ITL.
TEST(BenchE2E, SpeculationIsReportedNextToItl) {
  Server server({"--speculative-algorithm", "ngram", "--speculative-num-draft-tokens", "4"});
  const BenchRun r = bench(server, "--num-prompts 6 --input-len 16 --output-len 48 --ignore-eos --seed 5");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_TRUE(r.report.is_object()) << r.out;
  const json& res = r.report["results"][0];
  expect_no_errors(res);
  const json& spec = res["speculative"];
  ASSERT_TRUE(spec.is_object()) << res.dump();
  // Greedy text from the bundled model repeats itself within 48 tokens.
  EXPECT_GT(spec["draft_tokens"].get<double>(), 0) << spec.dump();
  EXPECT_LE(spec["accepted_tokens"].get<double>(), spec["draft_tokens"].get<double>());
  EXPECT_NE(r.out.find("Speculative: "), std::string::npos) << r.out;
}

TEST(BenchE2E, ChatMultiTurnSharedPrefixSweepAndApiKeys) {
  Server server({"--api-key", "sk-e2e"});
  // Multi-turn chat: every turn runs; usage counts match max_tokens exactly.
  BenchRun r = bench(server, "--api-key sk-e2e --endpoint /v1/chat/completions --dataset multi-turn --num-prompts 3 "
                             "--mt-turns 3 --input-len 12 --output-len 8 --ignore-eos --max-concurrency 2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  json res = r.report["results"][0];
  EXPECT_EQ(res["requests"], 9);
  expect_no_errors(res);
  EXPECT_EQ(res["output_tokens"], 9 * 8);
  // Shared prefix at two rates: one result block per rate.
  r = bench(server, "--api-key sk-e2e --dataset shared-prefix --sp-groups 2 --sp-prompts-per-group 3 "
                    "--sp-system-len 64 --sp-question-len 8 --output-len 4 --ignore-eos --sweep-rates 20,inf");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_EQ(r.report["results"].size(), 2u);
  for (const json& block : r.report["results"]) {
    EXPECT_EQ(block["completed"], 6);
    expect_no_errors(block);
  }
  EXPECT_EQ(r.report["results"][0]["request_rate"], 20.0);
  EXPECT_EQ(r.report["results"][1]["request_rate"], "inf");
  EXPECT_EQ(r.report["results"][0]["seed"], 0);  // each rate gets its own prompts
  EXPECT_EQ(r.report["results"][1]["seed"], 1);
  // A wrong key: every request is an http_status error, and the run still reports.
  r = bench(server, "--api-key wrong --served-model-name basalt-mini --num-prompts 4 --input-len 8 --output-len 4");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  res = r.report["results"][0];
  EXPECT_EQ(res["completed"], 0);
  EXPECT_EQ(res["errors"]["http_status"], 4);
  EXPECT_NE(r.out.find("HTTP 401"), std::string::npos) << r.out;
}

TEST(BenchE2E, BadFlagsAndUnreachableServersAreClearErrors) {
  Server server({});
  BenchRun r = bench(server, "--request-rate -3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("--request-rate"), std::string::npos) << r.out;
  r = bench(server, "--dataset sharegpt --dataset-path /nonexistent/file.json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("cannot read"), std::string::npos) << r.out;
  r = bench(server, "--endpoint /v1/embeddings");
  EXPECT_EQ(r.exit_code, 1);
  // Nothing listens on port 1: with a model name given, requests are counted as connect errors.
  const std::string command = std::string(BASALT_BINARY) +
                              " bench --base-url http://127.0.0.1:1 --served-model-name m --num-prompts 3 "
                              "--input-len 8 --output-len 4 --no-progress --output-json " +
                              (server.dir() / "down.json").string() + " >/dev/null 2>&1";
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const json down = json::parse(slurp(server.dir() / "down.json"), nullptr, false);
  EXPECT_EQ(down["results"][0]["errors"]["connect"], 3);
}

TEST(BenchE2E, Https) {
#ifndef BASALT_LOADGEN_TLS
  GTEST_SKIP() << "built without OpenSSL";
#endif
  const std::string tls = std::string(BASALT_TESTDATA) + "/tls/";
  Server server({"--tls-cert", tls + "cert.pem", "--tls-key", tls + "key.pem"});
  ASSERT_EQ(server.url().rfind("https://", 0), 0u);
  // The test certificate is self-signed: verified, every request fails to connect...
  BenchRun r = bench(server, "--served-model-name basalt-mini --num-prompts 2 --input-len 8 --output-len 4");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.report["results"][0]["errors"]["connect"], 2);
  EXPECT_NE(r.out.find("certificate verify failed"), std::string::npos) << r.out;
  // ...and with --insecure they all run.
  r = bench(server, "--insecure --num-prompts 4 --input-len 8 --output-len 4 --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.report["results"][0]["completed"], 4);
  EXPECT_EQ(r.report["results"][0]["output_tokens"], 16);
}

struct Command {
  int exit_code = -1;
  std::string out, err;
};

Command run_command(const std::string& args) {
  const fs::path dir = fs::temp_directory_path() / ("basalt_cold_start_e2e_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string command = std::string(BASALT_BINARY) + " " + args + " >" + (dir / "out").string() + " 2>" +
                              (dir / "err").string();
  const int status = std::system(command.c_str());
  Command c{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir / "out"), slurp(dir / "err")};
  fs::remove_all(dir);
  return c;
}

// Every run's phases: positive, in start order, ending with ready; the ones
// every start of the bundled model on the CPU goes through are there.
void expect_ordered_phases(const json& phases, const std::string& where) {
  ASSERT_TRUE(phases.is_array() && !phases.empty()) << where;
  const std::vector<std::string> order = {"listening", "mmap", "read", "upload", "kv_cache", "graphs", "warmup",
                                          "ready"};
  double previous = 0;
  size_t previous_rank = 0;
  std::vector<std::string> names;
  for (const json& p : phases) {
    const std::string name = p["phase"].get<std::string>();
    const auto rank = static_cast<size_t>(std::find(order.begin(), order.end(), name) - order.begin());
    ASSERT_LT(rank, order.size()) << where << ": unknown phase " << name;
    EXPECT_TRUE(names.empty() || rank > previous_rank) << where << ": " << name << " out of order";
    const double t = p["since_start_s"].get<double>();
    EXPECT_GT(t, 0) << where << ": " << name;
    EXPECT_GE(t, previous) << where << ": " << name;
    previous = t;
    previous_rank = rank;
    names.push_back(name);
  }
  for (const char* needed : {"listening", "mmap", "upload", "kv_cache", "graphs", "ready"})
    EXPECT_NE(std::find(names.begin(), names.end(), needed), names.end()) << where << ": no " << needed;
  EXPECT_EQ(names.back(), "ready") << where;
}

TEST(ColdStartE2E, ReportsEveryRunsPhasesInOrderNextToTheFloor) {
  const Command c = run_command("bench --cold-start --cold-start-runs 2 --json -- --no-request-log");
  ASSERT_EQ(c.exit_code, 0) << c.out << c.err;
  const json r = json::parse(c.out, nullptr, false);
  ASSERT_TRUE(r.is_object()) << c.out;
  EXPECT_EQ(r["config"]["device"], "cpu");
  EXPECT_EQ(r["config"]["serve_args"], json::array({"--no-request-log"}));
  EXPECT_NE(r["config"]["command"].get<std::string>().find("--cold-start-runs 2 --cold-start-cache both -- "
                                                            "--no-request-log"),
            std::string::npos);
  // The weights are the model's safetensors files.
  uint64_t bytes = 0;
  int files = 0;
  for (const auto& entry : fs::directory_iterator(r["config"]["model"].get<std::string>()))
    if (entry.path().extension() == ".safetensors") bytes += fs::file_size(entry.path()), ++files;
  EXPECT_EQ(r["weights"]["bytes"], bytes);
  EXPECT_EQ(r["weights"]["files"], files);
  EXPECT_GT(r["rates"]["disk_read_bytes_per_s"].get<double>(), 0);
  EXPECT_GT(r["rates"]["page_cache_read_bytes_per_s"].get<double>(), 0);
  EXPECT_TRUE(r["rates"]["host_to_device_bytes_per_s"].is_null());
  ASSERT_EQ(r["caches"].size(), 2u);
  EXPECT_EQ(r["caches"][0]["cache"], "cold");
  EXPECT_EQ(r["caches"][1]["cache"], "warm");
  for (const json& cache : r["caches"]) {
    const std::string name = cache["cache"].get<std::string>();
    ASSERT_EQ(cache["runs"].size(), 2u) << name;
    for (const json& run : cache["runs"]) {
      expect_ordered_phases(run["phases"], name);
      EXPECT_GT(run["ready_seen_s"].get<double>(), 0) << name;
      EXPECT_GT(run["first_request_s"].get<double>(), 0) << name;
      EXPECT_GE(run["cached_before"].get<double>(), 0) << name;
      EXPECT_LE(run["cached_before"].get<double>(), 1) << name;
    }
    const json& median = cache["median"];
    expect_ordered_phases(median["phases"], name + " median");
    for (const json& p : median["phases"]) EXPECT_GE(p["took_s"].get<double>(), 0) << name;
    EXPECT_GT(cache["floor_s"].get<double>(), 0) << name;
    EXPECT_GT(median["ready_over_floor"].get<double>(), 0) << name;
    EXPECT_EQ(median["ready_s"], median["ready_seen_s"]) << name;
  }
}

TEST(ColdStartE2E, WarmupIsAPhaseAndTheTableNamesThePhases) {
  const Command c = run_command("bench --cold-start --cold-start-runs 1 --cold-start-cache warm -- --warmup on "
                                "--no-request-log");
  ASSERT_EQ(c.exit_code, 0) << c.out << c.err;
  for (const char* text : {"warm end", "listening", "mmap", "warmup", "ready (client)/floor", "first request"})
    EXPECT_NE(c.out.find(text), std::string::npos) << text << "\n" << c.out;
  EXPECT_EQ(c.out.find("cold end"), std::string::npos) << c.out;
}

TEST(ColdStartE2E, BadArgumentsAndFailingServersAreClearErrors) {
  Command c = run_command("bench --cold-start --cold-start-runs 0");
  EXPECT_EQ(c.exit_code, 1);
  EXPECT_NE(c.err.find("--cold-start-runs must be in [1, 1000]"), std::string::npos) << c.err;
  c = run_command("bench --cold-start -- --port 9000");
  EXPECT_EQ(c.exit_code, 1);
  EXPECT_NE(c.err.find("--port is set by the bench"), std::string::npos) << c.err;
  c = run_command("bench --cold-start --base-url http://127.0.0.1:1");
  EXPECT_EQ(c.exit_code, 1);
  EXPECT_NE(c.err.find("--base-url is for a load test"), std::string::npos) << c.err;
  c = run_command("bench --cold-start --cold-start-cache lukewarm");
  EXPECT_EQ(c.exit_code, 1);
  EXPECT_NE(c.err.find("expected both, cold or warm"), std::string::npos) << c.err;
  c = run_command("bench --num-prompts 1 -- --device cpu");
  EXPECT_EQ(c.exit_code, 1);
  EXPECT_NE(c.err.find("for --cold-start"), std::string::npos) << c.err;
  // A server that stops at start: the bench fails with its log.
  c = run_command("bench --cold-start --cold-start-runs 1 --cold-start-cache warm -- --max-running 0");
  EXPECT_EQ(c.exit_code, 1);
  EXPECT_NE(c.err.find("before it was ready"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("--max-running must be >= 1"), std::string::npos) << c.err;
}

}  // namespace

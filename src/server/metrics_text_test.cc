// The Prometheus text: every family has HELP and TYPE, histograms are
// cumulative with +Inf equal to the count, label values are escaped, and the
// vLLM-named gauges carry the engine's values.
#include "server/metrics_text.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>

namespace basalt {
namespace {

TEST(MetricsText, FamiliesHistogramsAndVllmNames) {
  MetricsInput in;
  in.model_name = "we\"ird\\name";
  in.engine.running = 3;
  in.engine.queued = 5;
  in.engine.kv_capacity = 200;
  in.engine.kv_used = 50;
  in.engine.ttft.observe(0.002);
  in.engine.ttft.observe(0.5);
  in.engine.ttft.observe(500);
  in.engine.output_tokens = 42;
  in.engine.requests_finished = 10;
  in.engine.requests_stopped = 4;
  in.engine.draft_tokens = 9;
  in.engine.accepted_draft_tokens = 5;
  in.engine.accepted_by_position = {4, 1};
  in.http_requests[{"/v1/completions", 200}] = 7;
  in.startup_phases = {{"listening", 0.03}, {"mmap", 0.05}, {"ready", 1.25}};
  const std::string text = render_metrics(in);

  std::set<std::string> typed, helped;
  std::map<std::string, std::string> samples;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("# TYPE ", 0) == 0) typed.insert(line.substr(7, line.find(' ', 7) - 7));
    else if (line.rfind("# HELP ", 0) == 0) helped.insert(line.substr(7, line.find(' ', 7) - 7));
    else {
      const size_t space = line.rfind(' ');
      samples[line.substr(0, space)] = line.substr(space + 1);
      const std::string name = line.substr(0, line.find('{'));
      std::string family = name;
      for (const char* suffix : {"_bucket", "_sum", "_count"})
        if (family.size() > std::string(suffix).size() &&
            family.compare(family.size() - std::string(suffix).size(), std::string::npos, suffix) == 0 &&
            typed.count(family.substr(0, family.size() - std::string(suffix).size())))
          family = family.substr(0, family.size() - std::string(suffix).size());
      EXPECT_TRUE(typed.count(family)) << "no TYPE before " << line;
    }
  }
  EXPECT_EQ(typed, helped);
  const std::string label = "model_name=\"we\\\"ird\\\\name\"";
  EXPECT_EQ(samples["vllm:num_requests_running{" + label + "}"], "3");
  EXPECT_EQ(samples["vllm:num_requests_waiting{" + label + "}"], "5");
  EXPECT_EQ(samples["vllm:kv_cache_usage_perc{" + label + "}"], "0.25");
  EXPECT_EQ(samples["vllm:gpu_cache_usage_perc{" + label + "}"], "0.25");
  EXPECT_EQ(samples["basalt_time_to_first_token_seconds_bucket{" + label + ",le=\"0.003\"}"], "1");
  EXPECT_EQ(samples["basalt_time_to_first_token_seconds_bucket{" + label + ",le=\"1\"}"], "2");
  EXPECT_EQ(samples["basalt_time_to_first_token_seconds_bucket{" + label + ",le=\"100\"}"], "2");
  EXPECT_EQ(samples["basalt_time_to_first_token_seconds_bucket{" + label + ",le=\"+Inf\"}"], "3");
  EXPECT_EQ(samples["basalt_time_to_first_token_seconds_count{" + label + "}"], "3");
  EXPECT_EQ(samples["basalt_http_requests_total{" + label + ",route=\"/v1/completions\",status=\"200\"}"], "7");
  // vLLM's counters and histograms carry the same figures.
  EXPECT_EQ(samples["vllm:generation_tokens_total{" + label + "}"], "42");
  EXPECT_EQ(samples["basalt_spec_draft_tokens_total{" + label + "}"], "9");
  EXPECT_EQ(samples["basalt_spec_accepted_tokens_total{" + label + "}"], "5");
  EXPECT_EQ(samples["basalt_spec_accepted_by_position_total{" + label + ",position=\"1\"}"], "1");
  EXPECT_EQ(samples["vllm:request_success_total{" + label + ",finished_reason=\"stop\"}"], "4");
  EXPECT_EQ(samples["vllm:request_success_total{" + label + ",finished_reason=\"length\"}"], "6");
  EXPECT_EQ(samples["vllm:time_to_first_token_seconds_count{" + label + "}"], "3");
  EXPECT_EQ(samples["vllm:time_to_first_token_seconds_bucket{" + label + ",le=\"1\"}"], "2");
  EXPECT_EQ(samples["basalt_engine_startup_seconds{" + label + ",phase=\"mmap\"}"], "0.05");
  EXPECT_EQ(samples["basalt_engine_startup_seconds{" + label + ",phase=\"ready\"}"], "1.25");
}

TEST(MetricsText, NoStartupFamilyWithoutPhases) {
  EXPECT_EQ(render_metrics(MetricsInput{}).find("basalt_engine_startup_seconds"), std::string::npos);
}

}  // namespace
}  // namespace basalt

#include "loadgen/report.h"

#include <gtest/gtest.h>

namespace basalt::loadgen {
namespace {

RequestRecord ok(double sent, std::vector<double> tokens, int64_t usage, double end) {
  RequestRecord r;
  r.input_tokens = 10;
  r.result.sent_s = sent;
  r.result.token_times = tokens;
  r.result.first_token_s = tokens.empty() ? -1 : tokens[0];
  r.result.chunk_tokens = static_cast<int64_t>(tokens.size());
  r.result.usage_completion_tokens = usage;
  r.result.end_s = end;
  return r;
}

// Basalt's and vLLM's counter names, summed over their series; comments,
// other metrics and malformed values are passed over.
TEST(SpecCounters, SumsTheKnownCountersOfEitherServer) {
  const auto basalt = spec_counters(
      "# HELP basalt_spec_draft_tokens_total Draft tokens.\n"
      "# TYPE basalt_spec_draft_tokens_total counter\n"
      "basalt_spec_draft_tokens_total{model=\"m\"} 120\n"
      "basalt_spec_accepted_tokens_total{model=\"m\"} 7.5e1\n"
      "basalt_spec_accepted_by_position_total{model=\"m\",position=\"0\"} 50\n"
      "basalt_jump_forward_tokens_total{model=\"m\"} 30\n"
      "basalt_spec_draft_tokens_total{model=\"n\"} 10\n"
      "basalt_spec_accepted_tokens_total{model=\"n\"} not-a-number\n"
      "basalt_requests_total 99");
  ASSERT_TRUE(basalt.has_value());
  EXPECT_DOUBLE_EQ(basalt->drafted, 130);
  EXPECT_DOUBLE_EQ(basalt->accepted, 75);
  EXPECT_DOUBLE_EQ(basalt->jump_forward, 30);
  const auto vllm = spec_counters(
      "vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"x\"} 40.0\n"
      "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"x\"} 10.0\n");
  ASSERT_TRUE(vllm.has_value());
  EXPECT_DOUBLE_EQ(vllm->drafted, 40);
  EXPECT_DOUBLE_EQ(vllm->accepted, 10);
  EXPECT_FALSE(spec_counters("vllm:num_requests_running 3\n# basalt_spec_draft_tokens_total 5\n").has_value());
  EXPECT_FALSE(spec_counters("").has_value());
}

TEST(SpecCounters, ShownNextToItlAndInTheJson) {
  Metrics m;
  EXPECT_TRUE(metrics_json(m)["speculative"].is_null());
  EXPECT_EQ(metrics_table(m).find("Speculative"), std::string::npos);
  m.speculation = SpecCounters{200, 150, 40};
  const std::string table = metrics_table(m);
  EXPECT_NE(table.find("Speculative: 75.0% of 200 drafts accepted (150; 40 of them forced text)"), std::string::npos)
      << table;
  EXPECT_LT(table.find("ITL"), table.find("Speculative"));
  const nlohmann::json j = metrics_json(m)["speculative"];
  EXPECT_DOUBLE_EQ(j["acceptance"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(j["draft_tokens"].get<double>(), 200);
  EXPECT_DOUBLE_EQ(j["jump_forward_tokens"].get<double>(), 40);
}

TEST(Metrics, HandComputedRun) {
  RunResult run;
  run.wall_s = 2.0;
  run.cpu_user_s = 0.01;
  run.cpu_system_s = 0.01;
  // Request A: sent 0, tokens at 0.1, 0.2, 0.4; ends 0.5; no usage -> 3 tokens.
  run.records.push_back(ok(0.0, {0.1, 0.2, 0.4}, -1, 0.5));
  // Request B: sent 1.0, tokens at 1.3, 1.4; usage says 5 tokens (two held back); ends 1.5.
  run.records.push_back(ok(1.0, {1.3, 1.4}, 5, 1.5));
  RequestRecord bad;
  bad.result.error = ErrorKind::kHttpStatus;
  bad.result.error_message = "HTTP 429: busy";
  run.records.push_back(bad);
  bad.result.error = ErrorKind::kStream;
  bad.result.error_message = "the stream ended without data: [DONE]";
  run.records.push_back(bad);
  run.records[1].lag_s = 0.002;

  const Metrics m = compute_metrics(run, {250, 60});
  EXPECT_EQ(m.requests, 4);
  EXPECT_EQ(m.completed, 2);
  EXPECT_EQ(m.failed, 2);
  EXPECT_EQ(m.output_tokens, 8);  // 3 counted + 5 from usage
  EXPECT_EQ(m.input_tokens, 20);
  EXPECT_NEAR(m.ttft.mean, 200, 1e-9);    // 100 and 300 ms
  EXPECT_NEAR(m.ttft.median, 200, 1e-9);
  EXPECT_NEAR(m.ttft.max, 300, 1e-9);
  EXPECT_EQ(m.itl.count, 3);              // 100, 200, 100 ms
  EXPECT_NEAR(m.itl.median, 100, 1e-9);
  EXPECT_NEAR(m.itl.max, 200, 1e-9);
  // TPOT: A (500-100)/2 = 200 ms, B (500-300)/4 = 50 ms.
  EXPECT_NEAR(m.tpot.min, 50, 1e-9);
  EXPECT_NEAR(m.tpot.max, 200, 1e-9);
  EXPECT_NEAR(m.e2e.mean, 500, 1e-9);
  // Goodput: A fails TPOT (200 > 60), B: TTFT 300 > 250 fails too.
  EXPECT_EQ(m.good, 0);
  EXPECT_EQ(compute_metrics(run, {300.001, 200.001}).good, 2);
  EXPECT_EQ(compute_metrics(run, {300.001, 60}).good, 1);
  EXPECT_NEAR(m.request_throughput, 1.0, 1e-12);
  EXPECT_NEAR(m.output_throughput, 4.0, 1e-12);
  EXPECT_EQ(m.errors.at("http_status"), 1);
  EXPECT_EQ(m.errors.at("stream"), 1);
  ASSERT_EQ(m.error_examples.size(), 2u);
  EXPECT_EQ(m.error_examples[0], "http_status: HTTP 429: busy");
  EXPECT_NEAR(m.cpu_us_per_token, 0.02 * 1e6 / 8, 1e-6);
  EXPECT_FALSE(m.client_bottleneck);
  ASSERT_EQ(m.tokens_per_second.size(), 2u);
  EXPECT_EQ(m.tokens_per_second[0], 3);
  EXPECT_EQ(m.tokens_per_second[1], 2);

  const nlohmann::json j = metrics_json(m);
  EXPECT_EQ(j["errors"]["http_status"], 1);
  EXPECT_EQ(j["errors"]["connect"], 0);
  EXPECT_EQ(j["errors"]["timeout"], 0);
  EXPECT_EQ(j["completed"], 2);
  EXPECT_DOUBLE_EQ(j["ttft_ms"]["p99"].get<double>(), m.ttft.p99);
  EXPECT_EQ(j["client"]["bottleneck"], false);
  const std::string table = metrics_table(m);
  EXPECT_NE(table.find("TTFT"), std::string::npos);
  EXPECT_NE(table.find("1 http_status"), std::string::npos);
}

// --save-detailed: every request by its place in the trace, failed ones
// with their error and no latencies; only when asked.
TEST(Metrics, DetailsListEveryRequestInTraceOrder) {
  RunResult run;
  run.wall_s = 2.0;
  RequestRecord b = ok(1.0, {1.3, 1.4}, 5, 1.5);
  b.conversation = 1;
  b.scheduled_s = 0.99;
  RequestRecord a = ok(0.0, {0.1, 0.2, 0.4}, -1, 0.5);
  RequestRecord bad;
  bad.conversation = 2;
  bad.input_tokens = 7;
  bad.result.error = ErrorKind::kTimeout;
  bad.result.error_message = "no answer in 600 s";
  run.records = {bad, b, a};  // in the order they ended
  EXPECT_TRUE(compute_metrics(run, {}).details.empty());
  EXPECT_FALSE(metrics_json(compute_metrics(run, {})).contains("details"));
  const Metrics m = compute_metrics(run, {}, 0, /*detailed=*/true);
  ASSERT_EQ(m.details.size(), 3u);
  EXPECT_EQ(m.details[0].index, 0);
  EXPECT_NEAR(m.details[0].ttft_ms, 100, 1e-9);
  EXPECT_NEAR(m.details[0].e2e_ms, 500, 1e-9);
  EXPECT_EQ(m.details[0].output_tokens, 3);
  EXPECT_EQ(m.details[1].index, 1);
  EXPECT_DOUBLE_EQ(m.details[1].scheduled_s, 0.99);
  EXPECT_NEAR(m.details[1].ttft_ms, 300, 1e-9);
  EXPECT_EQ(m.details[1].output_tokens, 5);  // the usage's count
  EXPECT_EQ(m.details[1].input_tokens, 10);
  EXPECT_EQ(m.details[2].index, 2);
  EXPECT_EQ(m.details[2].ttft_ms, -1);
  EXPECT_EQ(m.details[2].e2e_ms, -1);
  EXPECT_EQ(m.details[2].input_tokens, 7);
  EXPECT_EQ(m.details[2].error, "timeout: no answer in 600 s");
  const nlohmann::json j = metrics_json(m);
  ASSERT_EQ(j["details"].size(), 3u);
  EXPECT_EQ(j["details"][1]["index"], 1);
  EXPECT_DOUBLE_EQ(j["details"][1]["ttft_ms"].get<double>(), m.details[1].ttft_ms);
  EXPECT_EQ(j["details"][2]["error"], "timeout: no answer in 600 s");
  EXPECT_EQ(j["details"][0]["error"], "");
}

TEST(Metrics, FlagsAClientBottleneck) {
  RunResult run;
  run.wall_s = 1.0;
  run.cpu_user_s = 0.95;
  RequestRecord r = ok(0, {0.01}, -1, 0.02);
  r.lag_s = 0.05;
  run.records.push_back(r);
  const Metrics m = compute_metrics(run, {});
  EXPECT_TRUE(m.client_bottleneck);
  EXPECT_EQ(m.bottleneck_reasons.size(), 2u);
  EXPECT_NE(metrics_table(m).find("WARNING"), std::string::npos);
}

TEST(Metrics, JudgesArrivalLagAgainstTheGapBetweenArrivals) {
  const auto with_lag = [](double lag_s, double rate) {
    RunResult run;
    run.wall_s = 10.0;
    for (int i = 0; i < 100; ++i) {
      RequestRecord r = ok(0, {0.01}, -1, 0.02);
      r.lag_s = lag_s;
      run.records.push_back(r);
    }
    return compute_metrics(run, {}, rate);
  };
  // 17 ms at 4 requests/s is 7% of the 250 ms gap: no warning.
  EXPECT_FALSE(with_lag(0.017, 4).client_bottleneck);
  EXPECT_TRUE(with_lag(0.040, 4).client_bottleneck);
  // 2 ms at 2,000 requests/s is four gaps; 0.5 ms is timer jitter.
  EXPECT_TRUE(with_lag(0.002, 2000).client_bottleneck);
  EXPECT_FALSE(with_lag(0.0005, 2000).client_bottleneck);
  // An unlimited rate keeps the 10 ms rule.
  EXPECT_FALSE(with_lag(0.008, 0).client_bottleneck);
  const Metrics late = with_lag(0.012, 0);
  ASSERT_TRUE(late.client_bottleneck);
  EXPECT_NE(late.bottleneck_reasons[0].find("12.0 ms"), std::string::npos);
  EXPECT_NE(with_lag(0.040, 4).bottleneck_reasons[0].find("250.0 ms mean gap"), std::string::npos);
}

TEST(Svg, DrawsEveryPanelAndEscapesLabels) {
  RunResult run;
  run.wall_s = 1.0;
  run.records.push_back(ok(0.0, {0.1, 0.2, 0.4}, -1, 0.5));
  Metrics a = compute_metrics(run, {});
  a.label = "<cache on> & more";
  Metrics b = a;
  b.rate = 4;
  const std::string svg = render_svg({a, b}, "title \"x\"");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("&lt;cache on&gt; &amp; more"), std::string::npos);
  EXPECT_EQ(svg.find("<cache on>"), std::string::npos);
  EXPECT_NE(svg.find("title &quot;x&quot;"), std::string::npos);
  EXPECT_NE(svg.find("TTFT CDF"), std::string::npos);
  EXPECT_NE(svg.find("Output tokens per second over time"), std::string::npos);
  size_t lines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++lines;
  EXPECT_EQ(lines, 10u);  // 5 panels x 2 runs
  // An empty run still renders.
  EXPECT_NE(render_svg({Metrics{}}, "").find("</svg>"), std::string::npos);
}

}  // namespace
}  // namespace basalt::loadgen

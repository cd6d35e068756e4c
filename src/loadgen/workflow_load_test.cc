// Workflow runs as load, against a scripted server: completed, failed and
// refused runs told apart, their times ordered, the summary's counts.
#include "loadgen/workflow_load.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/io_context.hpp>

#include "server/http_server.h"

namespace basalt::loadgen {
namespace {

TEST(WorkflowLoad, RunsAreSentOnScheduleAndTheirEndsRead) {
  std::atomic<int> seen{0};
  HttpServerOptions server_options;
  server_options.port = 0;
  server_options.io_threads = 1;
  HttpServer server(server_options, [&](HttpRequest& request) {
    const int n = seen++;
    HandlerResult r;
    EXPECT_EQ(request.path, "/v1/workflows/w/runs");
    EXPECT_EQ(request.body, R"({"input":{"x":1}})");
    EXPECT_EQ(request.header("authorization").value_or(""), "Bearer k");
    if (n % 3 == 2) {
      r.response.status = 429;
      r.response.body = "busy";
      return r;
    }
    r.response.content_type = "text/event-stream";
    r.response.body = "event: run\ndata: {}\n\nevent: step_result\ndata: {\"step\":\"a\"}\n\n";
    r.response.body += n % 3 == 0 ? "event: run_completed\ndata: {\"output\":1}\n\n"
                                  : "event: run_failed\ndata: {\"error\":\"no\"}\n\n";
    return r;
  });
  server.start();
  boost::asio::io_context io(1);
  HttpClient client(io, parse_base_url("http://127.0.0.1:" + std::to_string(server.port())));
  WorkflowLoadOptions o;
  o.path = "/v1/workflows/w/runs";
  o.body = R"({"input":{"x":1}})";
  o.api_key = "k";
  o.runs = 6;
  o.max_concurrency = 1;  // one at a time: the script's order is the runs' order
  o.shape.rate = 200;
  const WorkflowLoadResult result = run_workflow_load(io, client, o);
  ASSERT_EQ(result.records.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    const WorkflowRunRecord& r = result.records[i];
    EXPECT_EQ(r.ok, i % 3 == 0) << i;
    EXPECT_GE(r.sent_s, r.scheduled_s);
    EXPECT_GE(r.end_s, r.sent_s);
    if (i % 3 == 1) {
      EXPECT_EQ(r.error, R"(run_failed: {"error":"no"})");
    }
    if (i % 3 == 2) {
      EXPECT_EQ(r.error, "HTTP 429: busy");
    } else {
      EXPECT_GE(r.first_result_s, r.sent_s);
    }
  }
  const nlohmann::json s = summarize_workflow_load(result);
  EXPECT_EQ(s["runs"], 6);
  EXPECT_EQ(s["completed"], 2);
  EXPECT_EQ(s["failed"], 4);
  EXPECT_EQ(s["errors"]["run_failed"], 2);
  EXPECT_EQ(s["errors"]["HTTP 429"], 2);
  EXPECT_EQ(s["e2e_s"]["count"], 2);
  EXPECT_GT(s["e2e_s"]["p99"].get<double>(), 0);
  const std::string table = workflow_load_table(s, "t");
  EXPECT_NE(table.find("runs 6  completed 2  failed 4"), std::string::npos) << table;
  server.stop();
}

}  // namespace
}  // namespace basalt::loadgen

// Workflow runs as load (`basalt bench --workflow NAME`, docs/WORKFLOWS.md
// §4): the gateway's POST /v1/workflows/NAME/runs sent on an arrival
// schedule, each run's events read until it ends, end-to-end latencies
// reported as percentiles.
//
// Contract:
//  * run_workflow_load runs the io_context on the calling thread until
//    every run has ended and returns one record per run, in the order they
//    were sent. Run i is due at arrival_times(runs, shape)[i]; at most
//    max_concurrency runs are open at once (0: no limit), the others wait
//    in arrival order.
//  * A run succeeded when its stream carried a `run_completed` event; a
//    `run_failed` event, another status than 200, a broken or timed out
//    exchange, or a stream that ended without either is a failure, with
//    the reason kept. Times are seconds from the start of the load:
//    sent, first `step_result` event (-1: none), end.
//  * Nothing the server sends throws; summarize_workflow_load gives the
//    counts, the rate of completed runs over the wall time, and summaries
//    (stats.h) of the end-to-end and first-result latencies of completed
//    runs, as a JSON object (seconds); workflow_load_table the same as text.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loadgen/schedule.h"
#include "server/http_client.h"

namespace boost::asio {
class io_context;
}

namespace basalt::loadgen {

struct WorkflowLoadOptions {
  std::string path;  // /v1/workflows/NAME/runs (after the base URL's prefix)
  std::string body;  // {"input": ...}
  std::string api_key;
  int64_t runs = 10;
  int64_t max_concurrency = 0;
  LoadShape shape;
};

struct WorkflowRunRecord {
  double scheduled_s = 0;
  double sent_s = 0;
  double first_result_s = -1;
  double end_s = 0;
  bool ok = false;
  std::string error;
};

struct WorkflowLoadResult {
  std::vector<WorkflowRunRecord> records;
  double wall_s = 0;
};

WorkflowLoadResult run_workflow_load(boost::asio::io_context& io, HttpClient& client,
                                     const WorkflowLoadOptions& options);
nlohmann::json summarize_workflow_load(const WorkflowLoadResult& result);
std::string workflow_load_table(const nlohmann::json& summary, const std::string& title);

}  // namespace basalt::loadgen

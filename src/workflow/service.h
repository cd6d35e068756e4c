// WorkflowService: the runs of workflows in the gateway (docs/WORKFLOWS.md
// §2-4), behind `basalt route --workflows`.
//
// Contract:
//  * handle() answers the requests under /v1/workflows (the gateway checked
//    their API key): GET /v1/workflows lists the definitions; POST
//    /v1/workflows/{name}/runs starts (or resumes) a run and streams its
//    events (SSE) or, with "stream": false, answers its state when it ends;
//    GET /v1/workflows/{name}/runs/{id} answers a run's state. Bad bodies
//    and inputs are 400 naming the field, unknown workflows and runs 404,
//    a run already running 409. handle() never blocks.
//  * A model step is one streamed request handed to `dispatch` (the
//    gateway's RouteServer::handle) with the client's Authorization and
//    X-Basalt-Region, the run's session key (options.session_header:
//    `wf-RUN_ID`), an X-Request-Id per attempt and, when the definition
//    sets none, a seed derived from the run, step and item (so a retry or
//    a resumed run draws the same tokens); its response is read through
//    the ResponseProducer interface, event by event. An HTTP step is one
//    exchange on an HttpClient made at construction for its URL's origin.
//  * Steps start as soon as their predecessors are done; a map keeps at
//    most `concurrency` items in flight. Each attempt has the step's
//    timeout; a failed attempt is retried `retries` times (not a 4xx other than 408 and 429: the
//    request's own fault), then as often on the fallback model. A step that still fails fails the
//    run, and cancels the steps in flight. The client going away cancels its run.
//    Token events wait for a slow client up to 1 MiB unsent, then are left
//    out until it catches up (step results, which hold the text, never).
//  * With options.state_dir, each run's record is a file of JSON lines
//    appended as the run goes (run, item, step, end), written before the
//    events they record are sent; the constructor replays every file, so a
//    run posted again with its run_id resumes without re-running the steps
//    and map items that have a result. A record that cannot be written
//    fails its run (the record would not be the truth).
//  * metrics_text() gives the runs' and steps' families; one
//    `workflow_step` log line per finished step, one `workflow_run` per run.
//  * Callbacks run on `io` (the gateway's client threads); the service must
//    outlive the requests it answers and `io`'s threads.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "server/http_server.h"
#include "workflow/definition.h"

namespace boost::asio {
class io_context;
}

namespace basalt::workflow {

struct ServiceOptions {
  std::string state_dir;  // empty: runs are kept in memory only
  std::string session_header = "x-session-id";
  bool log_steps = true;
};

class WorkflowService {
 public:
  using Dispatch = std::function<HandlerResult(HttpRequest&)>;
  // Throws basalt::Error when an HTTP step's host does not resolve or the
  // state directory cannot be used.
  WorkflowService(std::map<std::string, std::shared_ptr<const Workflow>> workflows,
                  Dispatch dispatch, boost::asio::io_context& io, ServiceOptions options = {});
  ~WorkflowService();

  // Replaces the definitions (SIGHUP): new runs use the new ones; a run
  // already started keeps the definition it started with, resumed later
  // too (its record names its steps). Throws basalt::Error, keeping the
  // old ones, when an HTTP step's host does not resolve.
  void set_workflows(std::map<std::string, std::shared_ptr<const Workflow>> workflows);

  HandlerResult handle(HttpRequest& request);
  std::string metrics_text() const;
  // Runs read back from the state directory at construction.
  size_t replayed_runs() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace basalt::workflow

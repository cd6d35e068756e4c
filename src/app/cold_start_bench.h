// `basalt bench --cold-start`: starts `basalt serve` (this binary) on the
// model again and again and reports how long each start took, phase by
// phase, against the floor of reading the weights at the rates measured in
// the same run (loadgen/cold_start.h, docs/DEPLOY.md section 5).
//
// Contract: the weights' files are read three times with their pages
// dropped (the disk's rate: the best of the three, since a shared machine's
// other work only slows a read) and three times from the page cache (its
// rate, likewise); then, per cache
// state asked for ("cold": the files' pages dropped before each start,
// "warm": left as the previous start left them), `runs` servers are
// started one after the other on 127.0.0.1 and a free port, with
// `serve_args` after --host, --port and --model (those three are the
// bench's and refused in serve_args). Each is polled on /ready every 5 ms;
// once it answers 200 its /metrics are read for the phases, one
// one-token completion is timed, and it is stopped with SIGTERM. A server
// that exits, or is not ready within `timeout_s`, fails the bench with the
// tail of its log. With --device cuda in serve_args the backend's copy of
// host memory to the GPU is measured after the runs (the upload's rate).
// The report goes to stdout as a table, or as JSON with `json`; also as
// JSON to `output_json` when set.
#pragma once

#include <string>
#include <vector>

namespace basalt {

struct ColdStartOptions {
  std::string model;  // empty: the bundled model
  int runs = 5;
  std::string cache = "both";  // both, cold or warm
  std::vector<std::string> serve_args;
  double timeout_s = 600;
  std::string api_key;
  bool json = false;
  std::string output_json;
};

void run_cold_start_bench(const ColdStartOptions& options);

}  // namespace basalt

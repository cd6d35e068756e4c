// `basalt bench --cold-start`: the parts that need no server. Reading the
// start phases a replica exports, the page cache of the model's files, the
// disk's sequential read rate, and the report: each phase's median over the
// runs of a cache state ("cold": the files' pages dropped before each start;
// "warm": left cached) next to the floor, the weights' bytes over the rates
// measured in the same run (docs/DEPLOY.md section 5).
//
// Contract:
//  * startup_phases_from_metrics() reads the basalt_engine_startup_seconds
//    samples of a /metrics text, in the order given; other families are
//    skipped. A sample without a phase label, a phase given twice, or a
//    value that is not a finite number >= 0 throws basalt::Error quoting
//    the line. No sample at all gives an empty list (a server that does not
//    export them).
//  * drop_file_cache() asks the kernel to drop the file's clean pages from
//    the page cache (posix_fadvise DONTNEED; pages some process maps stay);
//    cached_fraction() is the share of the file's pages in the cache now
//    (mincore), 0 for an empty file. read_files() reads the files once, in
//    order, with 8 MiB read() calls, after dropping their pages when `cold`,
//    and returns the bytes over the seconds. All throw basalt::Error naming
//    the file when it cannot be opened or read.
//  * ColdStartReport holds the runs as measured; to_json() and table() add
//    the medians (of each phase's end time, of the time spent in each phase
//    since the one before, of the ready time seen by the client and of the
//    first request's time) and the ratio of the median ready time seen by
//    the client to the floor (the client's clock is exact; the server's
//    phases may be late by a clock tick, core/startup.h). A phase missing from some runs has its median over the runs
//    that have it. table() prints seconds with 3 decimals.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/startup.h"

namespace basalt::loadgen {

std::vector<StartupPhase> startup_phases_from_metrics(std::string_view metrics_text);

void drop_file_cache(const std::string& path);
double cached_fraction(const std::string& path);
struct ReadMeasurement {
  uint64_t bytes = 0;
  double seconds = 0;
  double bytes_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / seconds : 0; }
};
ReadMeasurement read_files(const std::vector<std::string>& paths, bool cold);

struct ColdStartRun {
  std::vector<StartupPhase> phases;  // as the server exported them
  double ready_seen_s = 0;           // spawn to the first 200 from /ready, on the client's clock
  double first_request_s = 0;        // a one-token completion sent once ready
  double cached_before = 0;          // share of the weights' pages cached when the server started
};

struct ColdStartCache {
  std::string cache;  // "cold" or "warm"
  std::vector<ColdStartRun> runs;
};

struct ColdStartReport {
  std::string command;  // the bench's own command line, to reproduce the report
  std::string model_dir;
  std::vector<std::string> serve_args;
  std::string device;
  uint64_t weight_bytes = 0;
  int weight_files = 0;
  double disk_read_bytes_per_s = 0;        // the files read with their pages dropped first
  double cached_after_drop = 0;            // share of their pages still cached right after dropping them
  double page_cache_read_bytes_per_s = 0;  // the same files read again, from the cache
  std::optional<double> host_to_device_bytes_per_s;  // --device cuda: the backend's copy of host memory
  std::vector<ColdStartCache> caches;

  // The floor of a start: the weights read at the measured rate (the disk's
  // for a cold cache, the page cache's for a warm one) or their upload at
  // the host-to-device rate where there is one, whichever is slower (the
  // loader overlaps the two).
  double floor_s(bool cold) const;
  nlohmann::json to_json() const;
  std::string table() const;
};

}  // namespace basalt::loadgen

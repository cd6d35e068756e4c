// A server's cold start, phase by phase: when each phase of bringing a
// replica up ended, in seconds since the process started (docs/DEPLOY.md
// section 5). `basalt serve` logs a `startup` line per phase and exports
// the times as basalt_engine_startup_seconds{phase} on /metrics, which
// `basalt bench --cold-start` reads.
//
// Contract:
//  * seconds_since_process_start() counts from the kernel's record of the
//    process's start (/proc/self/stat, in clock ticks since boot, compared
//    with CLOCK_BOOTTIME), so exec, dynamic linking and static
//    initialisers are included; the tick (usually 10 ms) rounds the start
//    down, so the count is never below the true time and at most one tick
//    above it. Where /proc cannot be read it counts from this library's
//    static initialisation instead.
//  * The phases, in the order a start goes through them (kStartupPhases):
//    listening (the port is bound), mmap (the checkpoint mapped and its
//    headers validated), read (the weights read into the page cache: dense
//    models only, which prefetch), upload (the weights on the backend: a
//    copy to the GPU; on the CPU, views of the mapping), kv_cache (the KV
//    pool allocated), graphs (decode graphs recorded; nothing on the CPU),
//    warmup (synthetic requests, when on), ready (/ready turns 200).
//  * mark_startup_phase(name) records that phase as ended now, and logs
//    `startup phase=NAME since_start_s=T`, but only after
//    start_startup_timeline() (until then it does nothing, so tools and
//    tests that load models record nothing). A phase marked again (each
//    rank of a tensor-parallel model marks mmap and upload) keeps the
//    latest time: it ends when its last rank is done. start_startup_timeline()
//    forgets what was marked before. An unknown name
//    throws basalt::Error. Safe from any thread.
//  * startup_phases() is what was marked, in kStartupPhases order.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace basalt {

inline constexpr std::array<std::string_view, 8> kStartupPhases = {
    "listening", "mmap", "read", "upload", "kv_cache", "graphs", "warmup", "ready"};

struct StartupPhase {
  std::string name;
  double since_start_s = 0;  // when the phase ended
};

double seconds_since_process_start();
// Whether `name` is one of kStartupPhases.
bool is_startup_phase(std::string_view name);

void start_startup_timeline();
void mark_startup_phase(std::string_view name);
std::vector<StartupPhase> startup_phases();

}  // namespace basalt

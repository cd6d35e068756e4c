#include "core/startup.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/log.h"

namespace basalt {
namespace {

double boottime_seconds() {
  timespec now{};
  ::clock_gettime(CLOCK_BOOTTIME, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

// The process's start in CLOCK_BOOTTIME seconds: field 22 of
// /proc/self/stat (clock ticks since boot). The command name (field 2) may
// hold spaces and parentheses, so fields are counted after its last ')'.
std::optional<double> kernel_start_boottime() {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i)  // fields 3 (state) to 22 (starttime)
    if (!(fields >> field)) return std::nullopt;
  char* end = nullptr;
  const unsigned long long ticks = std::strtoull(field.c_str(), &end, 10);
  const long per_second = ::sysconf(_SC_CLK_TCK);
  if (end == field.c_str() || *end != '\0' || per_second <= 0) return std::nullopt;
  return static_cast<double>(ticks) / static_cast<double>(per_second);
}

// Read during static initialisation, so the fallback starts as early as it can.
const std::chrono::steady_clock::time_point kStaticInit = std::chrono::steady_clock::now();
const std::optional<double> kKernelStart = kernel_start_boottime();

struct Timeline {
  std::mutex mu;
  bool started = false;
  std::map<std::string, double, std::less<>> ended;
};

Timeline& timeline() {
  static Timeline t;
  return t;
}

}  // namespace

double seconds_since_process_start() {
  if (kKernelStart) return std::max(0.0, boottime_seconds() - *kKernelStart);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - kStaticInit).count();
}

bool is_startup_phase(std::string_view name) {
  return std::find(kStartupPhases.begin(), kStartupPhases.end(), name) != kStartupPhases.end();
}

void start_startup_timeline() {
  Timeline& t = timeline();
  std::lock_guard<std::mutex> lock(t.mu);
  t.started = true;
  t.ended.clear();
}

void mark_startup_phase(std::string_view name) {
  BASALT_CHECK(is_startup_phase(name), "internal error: '{}' is not a startup phase", name);
  const double now = seconds_since_process_start();
  Timeline& t = timeline();
  {
    std::lock_guard<std::mutex> lock(t.mu);
    if (!t.started) return;
    auto it = t.ended.find(name);
    if (it == t.ended.end())
      t.ended.emplace(std::string(name), now);
    else
      it->second = std::max(it->second, now);
  }
  LogLine("startup").add("phase", name).add("since_start_s", now).emit();
}

std::vector<StartupPhase> startup_phases() {
  Timeline& t = timeline();
  std::lock_guard<std::mutex> lock(t.mu);
  std::vector<StartupPhase> out;
  for (std::string_view name : kStartupPhases)
    if (auto it = t.ended.find(name); it != t.ended.end()) out.push_back({it->first, it->second});
  return out;
}

}  // namespace basalt

#include "loadgen/cold_start.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "core/error.h"
#include "loadgen/stats.h"

namespace basalt::loadgen {
namespace {

using nlohmann::json;

constexpr std::string_view kFamily = "basalt_engine_startup_seconds";

// The value of label `key` in a sample's label set `{a="x",b="y"}`, with
// the format's escapes (\\, \", \n) undone; nullopt when absent.
std::optional<std::string> label_value(std::string_view labels, std::string_view key, std::string_view line) {
  size_t at = 0;
  while (at < labels.size()) {
    const size_t eq = labels.find('=', at);
    if (eq == std::string_view::npos || eq + 1 >= labels.size() || labels[eq + 1] != '"')
      fail("/metrics: malformed labels in '{}'", line);
    std::string_view name = labels.substr(at, eq - at);
    while (!name.empty() && (name.front() == ',' || name.front() == ' ')) name.remove_prefix(1);
    std::string value;
    size_t i = eq + 2;
    for (; i < labels.size() && labels[i] != '"'; ++i) {
      if (labels[i] == '\\' && i + 1 < labels.size()) {
        ++i;
        value += labels[i] == 'n' ? '\n' : labels[i];
      } else {
        value += labels[i];
      }
    }
    if (i >= labels.size()) fail("/metrics: unterminated label value in '{}'", line);
    if (name == key) return value;
    at = i + 1;
  }
  return std::nullopt;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int open_or_fail(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  BASALT_CHECK(fd >= 0, "{}: cannot open it: {}", path, std::strerror(errno));
  return fd;
}

std::string gigabytes_per_s(double bytes_per_s) { return fmt::format("{:.2f} GB/s", bytes_per_s / 1e9); }

}  // namespace

std::vector<StartupPhase> startup_phases_from_metrics(std::string_view text) {
  std::vector<StartupPhase> phases;
  std::set<std::string> seen;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
    if (line.empty() || line[0] == '#' || !line.starts_with(kFamily)) continue;
    std::string_view rest = line.substr(kFamily.size());
    if (rest.empty() || (rest[0] != '{' && rest[0] != ' ')) continue;  // a longer name with this prefix
    std::optional<std::string> phase;
    if (rest[0] == '{') {
      // The closing brace is the last one: label values may hold braces.
      const size_t close = rest.rfind('}');
      BASALT_CHECK(close != std::string_view::npos, "/metrics: unterminated labels in '{}'", line);
      phase = label_value(rest.substr(1, close - 1), "phase", line);
      rest = rest.substr(close + 1);
    }
    BASALT_CHECK(phase.has_value() && !phase->empty(), "/metrics: a startup sample without a phase: '{}'", line);
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    const std::string value_text(rest.substr(0, rest.find(' ')));
    char* parsed_end = nullptr;
    const double value = std::strtod(value_text.c_str(), &parsed_end);
    BASALT_CHECK(!value_text.empty() && parsed_end == value_text.c_str() + value_text.size() &&
                     std::isfinite(value) && value >= 0,
                 "/metrics: startup phase '{}' has no valid seconds (a finite number >= 0): '{}'", *phase, line);
    BASALT_CHECK(seen.insert(*phase).second, "/metrics: startup phase '{}' is given twice", *phase);
    phases.push_back({*phase, value});
  }
  return phases;
}

void drop_file_cache(const std::string& path) {
  Fd f{open_or_fail(path)};
  // Dirty pages are not dropped: write them back first (a model file just
  // written, say).
  ::fdatasync(f.fd);
  const int error = ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
  BASALT_CHECK(error == 0, "{}: cannot drop its cached pages: {}", path, std::strerror(error));
}

double cached_fraction(const std::string& path) {
  Fd f{open_or_fail(path)};
  struct stat st {};
  BASALT_CHECK(::fstat(f.fd, &st) == 0, "{}: cannot stat it: {}", path, std::strerror(errno));
  if (st.st_size == 0) return 0;
  const auto size = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, f.fd, 0);
  BASALT_CHECK(map != MAP_FAILED, "{}: cannot map it: {}", path, std::strerror(errno));
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((size + page - 1) / page);
  const int ok = ::mincore(map, size, resident.data());
  const int error = errno;
  ::munmap(map, size);
  BASALT_CHECK(ok == 0, "{}: mincore failed: {}", path, std::strerror(error));
  const auto cached = std::count_if(resident.begin(), resident.end(), [](unsigned char r) { return (r & 1) != 0; });
  return static_cast<double>(cached) / static_cast<double>(resident.size());
}

ReadMeasurement read_files(const std::vector<std::string>& paths, bool cold) {
  if (cold)
    for (const std::string& p : paths) drop_file_cache(p);
  constexpr size_t kChunk = 8u << 20;
  std::unique_ptr<char[]> buffer(new char[kChunk]);
  ReadMeasurement m;
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& p : paths) {
    Fd f{open_or_fail(p)};
    ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_SEQUENTIAL);  // a hint: its failure changes only speed
    for (;;) {
      const ssize_t n = ::read(f.fd, buffer.get(), kChunk);
      if (n < 0 && errno == EINTR) continue;
      BASALT_CHECK(n >= 0, "{}: read failed: {}", p, std::strerror(errno));
      if (n == 0) break;
      m.bytes += static_cast<uint64_t>(n);
    }
  }
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return m;
}

double ColdStartReport::floor_s(bool cold) const {
  const double read_rate = cold ? disk_read_bytes_per_s : page_cache_read_bytes_per_s;
  const auto bytes = static_cast<double>(weight_bytes);
  double floor = read_rate > 0 ? bytes / read_rate : 0;
  // The loader reads ahead on a thread of its own while it uploads, so the
  // slower of the two bounds the start, not their sum.
  if (host_to_device_bytes_per_s && *host_to_device_bytes_per_s > 0)
    floor = std::max(floor, bytes / *host_to_device_bytes_per_s);
  return floor;
}

namespace {

// Per phase name, in first-seen order over the runs: its end times and the
// time since the phase before it in the same run.
struct PhaseMedians {
  std::vector<std::string> order;
  std::map<std::string, std::vector<double>> ended, took;
};

PhaseMedians collect(const ColdStartCache& cache) {
  PhaseMedians m;
  for (const ColdStartRun& run : cache.runs) {
    double previous = 0;
    for (const StartupPhase& p : run.phases) {
      if (!m.ended.contains(p.name)) m.order.push_back(p.name);
      m.ended[p.name].push_back(p.since_start_s);
      m.took[p.name].push_back(std::max(0.0, p.since_start_s - previous));
      previous = p.since_start_s;
    }
  }
  return m;
}

double median_of(const std::vector<double>& v) { return summarize(v).median; }

}  // namespace

json ColdStartReport::to_json() const {
  json caches_json = json::array();
  for (const ColdStartCache& cache : caches) {
    json runs = json::array();
    std::vector<double> seen, first, cached;
    for (const ColdStartRun& r : cache.runs) {
      json phases = json::array();
      for (const StartupPhase& p : r.phases) phases.push_back({{"phase", p.name}, {"since_start_s", p.since_start_s}});
      runs.push_back({{"phases", phases},
                      {"ready_seen_s", r.ready_seen_s},
                      {"first_request_s", r.first_request_s},
                      {"cached_before", r.cached_before}});
      seen.push_back(r.ready_seen_s);
      first.push_back(r.first_request_s);
      cached.push_back(r.cached_before);
    }
    const PhaseMedians m = collect(cache);
    json phases = json::array();
    for (const std::string& name : m.order)
      phases.push_back({{"phase", name},
                        {"since_start_s", median_of(m.ended.at(name))},
                        {"took_s", median_of(m.took.at(name))},
                        {"runs", m.ended.at(name).size()}});
    const double floor = floor_s(cache.cache == "cold");
    const double ready = median_of(seen);
    caches_json.push_back({{"cache", cache.cache},
                           {"floor_s", floor},
                           {"runs", runs},
                           {"median",
                            {{"phases", phases},
                             {"ready_s", ready},
                             {"ready_seen_s", median_of(seen)},
                             {"first_request_s", median_of(first)},
                             {"cached_before", median_of(cached)},
                             {"ready_over_floor", floor > 0 ? json(ready / floor) : json(nullptr)}}}});
  }
  return {{"config", {{"command", command}, {"model", model_dir}, {"serve_args", serve_args}, {"device", device}}},
          {"weights", {{"bytes", weight_bytes}, {"files", weight_files}}},
          {"rates",
           {{"disk_read_bytes_per_s", disk_read_bytes_per_s},
            {"cached_after_drop", cached_after_drop},
            {"page_cache_read_bytes_per_s", page_cache_read_bytes_per_s},
            {"host_to_device_bytes_per_s",
             host_to_device_bytes_per_s ? json(*host_to_device_bytes_per_s) : json(nullptr)}}},
          {"caches", caches_json}};
}

std::string ColdStartReport::table() const {
  const json j = to_json();
  std::string args;
  for (const std::string& a : serve_args) args += (args.empty() ? "" : " ") + a;
  std::string s = fmt::format("==== cold start: {} ({}){} ====\n", model_dir, device,
                              args.empty() ? "" : ", serve " + args);
  if (weight_files == 0)
    s += "no weight files (random weights): no disk floor";
  else
    s += fmt::format("weights {:.1f} MB in {} file{}; disk read {} ({:.0f}% of pages still cached after the drop), "
                     "page cache {}",
                     static_cast<double>(weight_bytes) / 1e6, weight_files, weight_files == 1 ? "" : "s",
                     gigabytes_per_s(disk_read_bytes_per_s), 100 * cached_after_drop,
                     gigabytes_per_s(page_cache_read_bytes_per_s));
  if (host_to_device_bytes_per_s) s += fmt::format(", host to device {}", gigabytes_per_s(*host_to_device_bytes_per_s));
  s += "\n";
  if (!command.empty()) s += command + "\n";
  // Every phase any cache state saw, in the order they came.
  std::vector<std::string> names;
  for (const json& c : j["caches"])
    for (const json& p : c["median"]["phases"])
      if (std::find(names.begin(), names.end(), p["phase"].get<std::string>()) == names.end())
        names.push_back(p["phase"].get<std::string>());
  s += fmt::format("{:<22}", "median seconds");
  for (const json& c : j["caches"])
    s += fmt::format("{:>10}{:>10}", c["cache"].get<std::string>() + " end", "took");
  s += "\n";
  auto cell = [](const json& v) {
    return v.is_number() ? fmt::format("{:>10.3f}", v.get<double>()) : fmt::format("{:>10}", "-");
  };
  for (const std::string& name : names) {
    s += fmt::format("{:<22}", name);
    for (const json& c : j["caches"]) {
      json ended, took;
      for (const json& p : c["median"]["phases"])
        if (p["phase"] == name) ended = p["since_start_s"], took = p["took_s"];
      s += cell(ended) + cell(took);
    }
    s += "\n";
  }
  auto row = [&](const char* label, auto value_of) {
    s += fmt::format("{:<22}", label);
    for (const json& c : j["caches"]) s += value_of(c) + fmt::format("{:>10}", "");
    while (s.back() == ' ') s.pop_back();
    s += "\n";
  };
  row("ready (client)", [&](const json& c) { return cell(c["median"]["ready_seen_s"]); });
  row("first request", [&](const json& c) { return cell(c["median"]["first_request_s"]); });
  row("floor", [&](const json& c) { return cell(c["floor_s"]); });
  row("ready (client)/floor", [&](const json& c) {
    const json& r = c["median"]["ready_over_floor"];
    return r.is_number() ? fmt::format("{:>9.1f}x", r.get<double>()) : fmt::format("{:>10}", "-");
  });
  row("pages cached at start", [&](const json& c) {
    return fmt::format("{:>9.0f}%", 100 * c["median"]["cached_before"].get<double>());
  });
  s += fmt::format("({} runs per cache state; end: seconds since the server's process started; took: since the "
                   "phase before;\n ready (client): spawn to the first 200 from /ready; first request: a one-token "
                   "completion after that)\n",
                   caches.empty() ? 0 : caches.front().runs.size());
  return s;
}

}  // namespace basalt::loadgen

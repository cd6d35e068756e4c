#include "app/cold_start_bench.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "app/device_choice.h"
#include "app/model_dir.h"
#include "backend/backend.h"
#include "core/error.h"
#include "loadgen/client.h"
#include "loadgen/cold_start.h"
#include "model/checkpoint.h"

extern char** environ;

namespace basalt {
namespace {

namespace fs = std::filesystem;
using namespace loadgen;
using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

double seconds_since(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// The value of `--name VALUE` or `--name=VALUE` in args, if given.
std::optional<std::string> flag_value(const std::vector<std::string>& args, const std::string& name) {
  std::optional<std::string> value;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == name && i + 1 < args.size()) value = args[i + 1];
    if (args[i].rfind(name + "=", 0) == 0) value = args[i].substr(name.size() + 1);
  }
  return value;
}

bool has_flag(const std::vector<std::string>& args, const std::string& name) {
  for (const std::string& a : args)
    if (a == name || a.rfind(name + "=", 0) == 0) return true;
  return false;
}

// A port nothing listens on now (the kernel's pick for port 0).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  BASALT_CHECK(fd >= 0, "cold start: socket failed: {}", std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof address;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0;
  const int error = errno;
  ::close(fd);
  BASALT_CHECK(ok, "cold start: cannot find a free port: {}", std::strerror(error));
  return ntohs(address.sin_port);
}

std::string log_tail(const fs::path& log) {
  std::ifstream in(log);
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  constexpr size_t kTail = 2000;
  if (text.size() > kTail) text = "..." + text.substr(text.size() - kTail);
  return text;
}

// One `basalt serve` child; stopped (SIGTERM, then SIGKILL after 30 s) when
// destroyed.
class ServeProcess {
 public:
  ServeProcess(const std::vector<std::string>& args, const fs::path& log) {
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int error = ::posix_spawn(&pid_, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    BASALT_CHECK(error == 0, "cold start: cannot start `basalt serve`: {}", std::strerror(error));
  }
  ~ServeProcess() { stop(); }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  // The exit status text when the child has ended, else nullopt.
  std::optional<std::string> ended() {
    if (pid_ < 0) return "stopped";
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) return std::nullopt;
    pid_ = -1;
    return WIFEXITED(status) ? fmt::format("exited with status {}", WEXITSTATUS(status))
                             : fmt::format("was killed by signal {}", WTERMSIG(status));
  }

  void stop() {
    if (pid_ < 0) return;
    ::kill(pid_, SIGTERM);
    const auto deadline = SteadyClock::now() + std::chrono::seconds(30);
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (SteadyClock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

// One exchange, run to its end.
ExchangeResult exchange(boost::asio::io_context& io, CompletionClient& client, const std::string& method,
                        const std::string& path, std::string body = {}) {
  ExchangeResult result;
  client.send(method, path, std::move(body), false, false, [&](ExchangeResult&& r) { result = std::move(r); });
  io.restart();
  io.run();
  return result;
}

// Bytes-weighted share of the files' pages in the page cache.
double cached_share(const std::vector<std::string>& files) {
  double cached = 0, total = 0;
  for (const std::string& f : files) {
    const auto bytes = static_cast<double>(fs::file_size(f));
    cached += cached_fraction(f) * bytes;
    total += bytes;
  }
  return total > 0 ? cached / total : 0;
}

ColdStartRun start_once(const ColdStartOptions& o, const std::string& dir, const std::vector<std::string>& files,
                        bool cold, const fs::path& log) {
  if (cold)
    for (const std::string& f : files) drop_file_cache(f);
  ColdStartRun run;
  run.cached_before = cached_share(files);
  const int port = free_port();
  std::vector<std::string> args = {"basalt", "serve", "--host", "127.0.0.1", "--port", std::to_string(port),
                                   "--model", dir};
  args.insert(args.end(), o.serve_args.begin(), o.serve_args.end());

  boost::asio::io_context io(1);
  ClientOptions poll_options;
  poll_options.timeout_s = 5;
  CompletionClient poll(io, parse_url(fmt::format("http://127.0.0.1:{}", port)), poll_options);
  const auto start = SteadyClock::now();
  ServeProcess server(args, log);
  for (;;) {
    const ExchangeResult r = exchange(io, poll, "GET", "/ready");
    if (r.error == ErrorKind::kNone && r.http_status == 200) break;
    if (const std::optional<std::string> end = server.ended())
      fail("cold start: `basalt serve` {} before it was ready; its log:\n{}", *end, log_tail(log));
    if (seconds_since(start) > o.timeout_s) {
      server.stop();
      fail("cold start: `basalt serve` was not ready after {} s (--timeout); its log:\n{}", o.timeout_s,
           log_tail(log));
    }
    poll.close_idle();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  run.ready_seen_s = seconds_since(start);

  const ExchangeResult metrics = exchange(io, poll, "GET", "/metrics");
  BASALT_CHECK(metrics.error == ErrorKind::kNone, "cold start: GET /metrics: {}", metrics.error_message);
  run.phases = startup_phases_from_metrics(metrics.body);

  ClientOptions request_options;
  request_options.timeout_s = o.timeout_s;
  request_options.api_key = o.api_key;
  CompletionClient client(io, parse_url(fmt::format("http://127.0.0.1:{}", port)), request_options);
  const json body = {{"prompt", "Hello"}, {"max_tokens", 1}, {"temperature", 0}};
  const auto sent = SteadyClock::now();
  const ExchangeResult first = exchange(io, client, "POST", "/v1/completions", body.dump());
  run.first_request_s = seconds_since(sent);
  BASALT_CHECK(first.error == ErrorKind::kNone, "cold start: the first completion failed: {} {}", first.error_message,
               first.body);
  server.stop();
  return run;
}

// The backend's copy of pageable host memory to the GPU, as the loader
// uploads weights (best of three copies of 1 GiB).
std::optional<double> host_to_device_rate(const std::string& device) {
  try {
    std::unique_ptr<Backend> backend = make_backend(device);
    const int64_t floats = int64_t{1} << 28;
    Tensor host = Tensor::empty({floats}, DType::kF32);
    std::memset(host.raw(), 1, host.nbytes());
    Tensor on_device = backend->empty({floats}, DType::kF32);
    double best = 0;
    for (int i = 0; i < 3; ++i) {
      const auto start = SteadyClock::now();
      backend->copy(host, on_device);
      best = std::max(best, static_cast<double>(host.nbytes()) / seconds_since(start));
    }
    return best;
  } catch (const Error& e) {
    std::fprintf(stderr, "basalt bench: cannot measure the host-to-device rate: %s\n", e.what());
    return std::nullopt;
  }
}

// Removes the bench's scratch directory (the servers' logs) on the way out.
struct ScratchDir {
  fs::path path;
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

}  // namespace

void run_cold_start_bench(const ColdStartOptions& o) {
  BASALT_CHECK(o.runs >= 1 && o.runs <= 1000, "--cold-start-runs must be in [1, 1000], got {}", o.runs);
  BASALT_CHECK(o.cache == "both" || o.cache == "cold" || o.cache == "warm",
               "--cold-start-cache '{}': expected both, cold or warm", o.cache);
  BASALT_CHECK(o.timeout_s > 0 && o.timeout_s < 1e6, "--timeout must be positive seconds, got {}", o.timeout_s);
  for (const char* owned : {"--host", "--port", "--model"})
    BASALT_CHECK(!has_flag(o.serve_args, owned),
                 "cold start: {} is set by the bench (give the model as bench's --model); serve arguments "
                 "after -- are the others",
                 owned);
  for (const char* https : {"--tls-cert", "--tls-key"})
    BASALT_CHECK(!has_flag(o.serve_args, https), "cold start: {}: the bench polls its servers over plain HTTP", https);
  const std::string dir = model_dir_or_bundled(o.model);
  const std::string device = flag_value(o.serve_args, "--device").value_or("cpu");

  ColdStartReport report;
  report.command = fmt::format("basalt bench --cold-start --model {} --cold-start-runs {} --cold-start-cache {}", dir,
                               o.runs, o.cache);
  if (!o.serve_args.empty()) {
    report.command += " --";
    for (const std::string& a : o.serve_args) report.command += " " + a;
  }
  report.model_dir = dir;
  report.serve_args = o.serve_args;
  report.device = device;
  // The weights' files, as the server's loader finds them; none with
  // random weights (then there is no floor to compare with).
  std::vector<std::string> files;
  if (!has_flag(o.serve_args, "--random-weights")) files = Checkpoint::open(dir).files();
  for (const std::string& f : files) report.weight_bytes += fs::file_size(f);
  report.weight_files = static_cast<int>(files.size());
  if (!files.empty()) {
    // The best of three reads each way: a floor is what the disk and the
    // page cache can do, and a shared machine's other work only slows a
    // read down.
    for (int i = 0; i < 3; ++i) {
      report.disk_read_bytes_per_s = std::max(report.disk_read_bytes_per_s, read_files(files, true).bytes_per_s());
      // Right after a read, so the drop's effect is measured on cached pages.
      for (const std::string& f : files) drop_file_cache(f);
      report.cached_after_drop = std::max(report.cached_after_drop, cached_share(files));
    }
    read_files(files, false);
    for (int i = 0; i < 3; ++i)
      report.page_cache_read_bytes_per_s =
          std::max(report.page_cache_read_bytes_per_s, read_files(files, false).bytes_per_s());
  }

  ScratchDir scratch{fs::temp_directory_path() / fmt::format("basalt_cold_start_{}", ::getpid())};
  fs::create_directories(scratch.path);
  std::vector<std::string> caches;
  if (o.cache != "warm") caches.push_back("cold");
  if (o.cache != "cold") caches.push_back("warm");
  for (const std::string& cache : caches) {
    ColdStartCache c{cache, {}};
    for (int i = 0; i < o.runs; ++i) {
      std::fprintf(stderr, "basalt bench: cold start %s %d/%d\n", cache.c_str(), i + 1, o.runs);
      c.runs.push_back(start_once(o, dir, files, cache == "cold", scratch.path / "serve.log"));
    }
    report.caches.push_back(std::move(c));
  }
  if (device != "cpu") report.host_to_device_bytes_per_s = host_to_device_rate(device);

  const json j = report.to_json();
  if (o.json)
    std::fputs((j.dump(2) + "\n").c_str(), stdout);
  else
    std::fputs(report.table().c_str(), stdout);
  std::fflush(stdout);
  if (!o.output_json.empty()) {
    std::ofstream out(o.output_json);
    BASALT_CHECK(out.good(), "--output-json {}: cannot write it", o.output_json);
    out << j.dump(2) << "\n";
    BASALT_CHECK(out.good(), "--output-json {}: write failed", o.output_json);
  }
}

}  // namespace basalt

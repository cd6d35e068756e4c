// Test helper: runs the real `basalt` binary (BASALT_BINARY) as a user would,
// capturing its exit code, standard output and standard error.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace basalt::cli_test {

struct CliRun {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `ENV basalt ARGS` through the shell (ARGS may quote; ENV is a list of
// VAR=value assignments, or empty). Runs on several threads at once keep
// their standard errors apart.
inline CliRun run_with_env(const std::string& env, const std::string& args) {
  static std::atomic<int> runs{0};
  const auto err_path = std::filesystem::temp_directory_path() /
                        ("basalt_cli_" + std::to_string(::getpid()) + "_" + std::to_string(runs++) + ".err");
  const std::string command = env + " " + std::string(BASALT_BINARY) + " " + args + " 2>" + err_path.string();
  CliRun r;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) r.out.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  r.err.assign(std::istreambuf_iterator<char>(err), {});
  std::filesystem::remove(err_path);
  return r;
}

// Runs `basalt ARGS` through the shell (ARGS may quote).
inline CliRun run(const std::string& args) { return run_with_env("", args); }

}  // namespace basalt::cli_test

// The `basalt` subcommands. Each add_*_command registers its flags on the
// CLI11 app and a callback that does the work; errors surface as
// basalt::Error and main() turns them into a one-line message and exit code 1.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace basalt {

void add_generate_command(CLI::App& app);
void add_tokenize_commands(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_route_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_deploy_command(CLI::App& app);
void add_sim_command(CLI::App& app);

// Parses "1,2,3" (spaces allowed) into ids; throws basalt::Error naming the flag.
std::vector<int32_t> parse_id_list(const std::string& text, const std::string& flag);
// A file's whole contents; throws basalt::Error naming the flag when it cannot be read.
std::string read_text_file(const std::string& path, const char* flag);

}  // namespace basalt

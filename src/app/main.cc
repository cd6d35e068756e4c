// basalt: one binary, a subcommand per job (see `basalt --help`).
#include <cstdio>
#include <exception>

#include "app/commands.h"
#include "core/error.h"
#include "core/version.h"

int main(int argc, char** argv) {
  CLI::App app{"Basalt: serve and run open-weight LLMs"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("basalt ") + basalt::kBasaltVersion);
  basalt::add_generate_command(app);
  basalt::add_tokenize_commands(app);
  basalt::add_quantize_command(app);
  basalt::add_eval_command(app);
  basalt::add_serve_command(app);
  basalt::add_route_command(app);
  basalt::add_bench_command(app);
  basalt::add_deploy_command(app);
  basalt::add_sim_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "basalt: error: %s (see --help)\n", e.what());
    return 2;
  } catch (const basalt::Error& e) {
    std::fprintf(stderr, "basalt: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "basalt: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}

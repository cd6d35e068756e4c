// `basalt deploy check FILE`: validates a deployment spec (basalt.yaml,
// deploy/spec.h). Every problem is printed as `FILE:LINE: PATH: message`
// (to stderr; `--json` prints {"ok", "errors": [{"path", "line",
// "message"}]} to stdout instead) and the exit status is 1 when there is
// any; a valid file prints a one-line summary of what it deploys.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "core/error.h"
#include "deploy/spec.h"

namespace basalt {
namespace {

struct DeployCheckFlags {
  std::string file;
  bool json = false;
};

std::string summary(const deploy::DeploymentSpec& s) {
  const std::string gpus =
      s.resources.gpu_count == 0
          ? std::string("no GPU")
          : fmt::format("{} GPU{}{}", s.resources.gpu_count, s.resources.gpu_count == 1 ? "" : "s",
                        s.resources.gpu_product.empty() ? "" : " " + s.resources.gpu_product);
  return fmt::format("{}: {}-{} replica{} of {} serving {} ({} CPU, {} memory, {}{}), autoscaled on {} {}, {} gateway "
                     "replica{}",
                     s.name, s.replicas.min, s.replicas.max, s.replicas.max == 1 ? "" : "s", s.image, s.model.path,
                     s.resources.cpu, s.resources.memory, gpus,
                     s.resources.nodes > 1 ? fmt::format(", {} nodes each", s.resources.nodes) : "",
                     s.autoscaling.metric, s.autoscaling.target, s.gateway.replicas,
                     s.gateway.replicas == 1 ? "" : "s");
}

void run_check(const DeployCheckFlags& f) {
  const deploy::SpecResult r = deploy::parse_deployment_spec(read_text_file(f.file, "deploy check"));
  if (f.json) {
    nlohmann::json errors = nlohmann::json::array();
    for (const deploy::SpecError& e : r.errors)
      errors.push_back({{"path", e.path}, {"line", e.line}, {"message", e.message}});
    std::printf("%s\n", nlohmann::json{{"ok", r.errors.empty()}, {"errors", errors}}.dump().c_str());
  } else {
    for (const deploy::SpecError& e : r.errors)
      std::fprintf(stderr, "%s:%s %s\n", f.file.c_str(), e.line > 0 ? fmt::format("{}:", e.line).c_str() : "",
                   (e.path.empty() ? e.message : e.path + ": " + e.message).c_str());
    if (r.errors.empty()) std::printf("ok: %s\n", summary(r.spec).c_str());
  }
  BASALT_CHECK(r.errors.empty(), "{}: {} problem{}", f.file, r.errors.size(), r.errors.size() == 1 ? "" : "s");
}

}  // namespace

void add_deploy_command(CLI::App& app) {
  CLI::App* deploy = app.add_subcommand("deploy", "Deployment specs (basalt.yaml) for Kubernetes (docs/DEPLOY.md)");
  deploy->require_subcommand(1);
  auto flags = std::make_shared<DeployCheckFlags>();
  CLI::App* check = deploy->add_subcommand("check", "Validate a deployment spec; every error names its field and line");
  check->add_option("file", flags->file, "The spec (YAML), e.g. deploy/basalt.yaml")->required();
  check->add_flag("--json", flags->json, "Print {\"ok\", \"errors\": [{\"path\", \"line\", \"message\"}]}");
  check->callback([flags] { run_check(*flags); });
}

}  // namespace basalt

// `basalt deploy check FILE`: validates a deployment spec (basalt.yaml,
// deploy/spec.h). Every problem is printed as `FILE:LINE: PATH: message`
// (to stderr; `--json` prints {"ok", "errors": [{"path", "line",
// "message"}]} to stdout instead) and the exit status is 1 when there is
// any; a valid file prints a one-line summary of what it deploys.
//
// `basalt deploy render FILE [--out DIR] [--namespace NS] [--autoscaler
// keda|hpa]`: the Kubernetes objects the spec becomes (deploy/render.h), as
// YAML documents on stdout, or one file per object under DIR (created if
// missing; the paths written are printed). A spec with errors, or one that
// cannot be rendered, prints its problems as `check` does and writes
// nothing.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "core/error.h"
#include "deploy/render.h"
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

void print_errors(const std::string& file, const std::vector<deploy::SpecError>& errors) {
  for (const deploy::SpecError& e : errors)
    std::fprintf(stderr, "%s:%s %s\n", file.c_str(),
                 e.line > 0 ? fmt::format("{}:", e.line).c_str() : "",
                 (e.path.empty() ? e.message : e.path + ": " + e.message).c_str());
}

void run_check(const DeployCheckFlags& f) {
  const deploy::SpecResult r = deploy::parse_deployment_spec(read_text_file(f.file, "deploy check"));
  if (f.json) {
    nlohmann::json errors = nlohmann::json::array();
    for (const deploy::SpecError& e : r.errors)
      errors.push_back({{"path", e.path}, {"line", e.line}, {"message", e.message}});
    std::printf("%s\n", nlohmann::json{{"ok", r.errors.empty()}, {"errors", errors}}.dump().c_str());
  } else {
    print_errors(f.file, r.errors);
    if (r.errors.empty()) std::printf("ok: %s\n", summary(r.spec).c_str());
  }
  BASALT_CHECK(r.errors.empty(), "{}: {} problem{}", f.file, r.errors.size(), r.errors.size() == 1 ? "" : "s");
}

struct DeployRenderFlags {
  std::string file;
  std::string out_dir;
  std::string namespace_name = "default";
  std::string autoscaler = "keda";
};

void run_render(const DeployRenderFlags& f) {
  const deploy::SpecResult parsed =
      deploy::parse_deployment_spec(read_text_file(f.file, "deploy render"));
  print_errors(f.file, parsed.errors);
  BASALT_CHECK(parsed.errors.empty(), "{}: {} problem{}", f.file, parsed.errors.size(),
               parsed.errors.size() == 1 ? "" : "s");
  deploy::RenderOptions options;
  options.namespace_name = f.namespace_name;
  options.autoscaler = f.autoscaler == "hpa" ? deploy::Autoscaler::kHpa : deploy::Autoscaler::kKeda;
  const deploy::RenderResult rendered = deploy::render_manifests(parsed.spec, options);
  print_errors(f.file, rendered.errors);
  BASALT_CHECK(rendered.errors.empty(), "{}: cannot be rendered ({} problem{})", f.file,
               rendered.errors.size(), rendered.errors.size() == 1 ? "" : "s");
  if (f.out_dir.empty()) {
    std::string text;
    for (const nlohmann::ordered_json& object : rendered.objects)
      text += "---\n" + deploy::to_yaml(object);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return;
  }
  std::error_code ec;
  std::filesystem::create_directories(f.out_dir, ec);
  BASALT_CHECK(!ec, "--out {}: cannot create the directory: {}", f.out_dir, ec.message());
  for (const nlohmann::ordered_json& object : rendered.objects) {
    const std::filesystem::path path =
        std::filesystem::path(f.out_dir) / deploy::manifest_file_name(object);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << deploy::to_yaml(object);
    out.close();
    BASALT_CHECK(out.good(), "--out: cannot write {}", path.string());
    std::printf("%s\n", path.string().c_str());
  }
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

  auto render_flags = std::make_shared<DeployRenderFlags>();
  CLI::App* render = deploy->add_subcommand(
      "render", "Write the Kubernetes objects a deployment spec becomes (YAML)");
  render->add_option("file", render_flags->file, "The spec (YAML), e.g. deploy/basalt.yaml")
      ->required();
  render->add_option(
      "--out", render_flags->out_dir,
      "Write one file per object into this directory (default: every object to stdout)");
  render->add_option("--namespace", render_flags->namespace_name,
                     "The objects' namespace (default: default)");
  render
      ->add_option(
          "--autoscaler", render_flags->autoscaler,
          "keda (a ScaledObject with a Prometheus trigger) or hpa (a HorizontalPodAutoscaler on "
          "external metrics) (default keda)")
      ->check(CLI::IsMember({"keda", "hpa"}));
  render->callback([render_flags] { run_render(*render_flags); });
}

}  // namespace basalt

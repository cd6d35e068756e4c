// parse_deployment_spec: a full spec read field by field, the defaults, the
// commented example in deploy/basalt.yaml, and for every field bad values
// that must be reported with the field's path and line (all at once, not
// the first only).
#include "deploy/spec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace basalt::deploy {
namespace {

const char* kFull = R"(name: mini
image: registry.example/basalt:0.1-cpu
model:
  path: /models/basalt-mini
  volume: {pvc: models}
engine:
  args: ["--max-running", "64", "--fp8-compute=w8a16", "--tp", "4"]
  port: 9000
  startup_timeout: 20m
resources:
  cpu: 500m
  memory: 16Gi
  gpu: {count: 2, product: NVIDIA-H200}
  nodes: 2
replicas: {min: 0, max: 8}
autoscaling:
  metric: queue_time
  target: 0.5
  up_after: 45s
  down_after: 10m
  prometheus: http://prometheus.monitoring:9090
regions: [eu-west, us-east]
tenants: {secret: mini-tenants}
gateway: {replicas: 3}
)";

TEST(DeploySpec, ReadsEveryField) {
  const SpecResult r = parse_deployment_spec(kFull);
  ASSERT_TRUE(r.errors.empty()) << describe(r.errors.front());
  const DeploymentSpec& s = r.spec;
  EXPECT_EQ(s.name, "mini");
  EXPECT_EQ(s.image, "registry.example/basalt:0.1-cpu");
  EXPECT_EQ(s.model.path, "/models/basalt-mini");
  EXPECT_EQ(s.model.pvc, "models");
  EXPECT_EQ(s.engine.args, (std::vector<std::string>{"--max-running", "64", "--fp8-compute=w8a16", "--tp", "4"}));
  EXPECT_EQ(s.engine.port, 9000);
  EXPECT_EQ(s.engine.startup_timeout_s, 1200);
  EXPECT_EQ(s.resources.cpu, "500m");
  EXPECT_EQ(s.resources.memory, "16Gi");
  EXPECT_EQ(s.resources.gpu_count, 2);
  EXPECT_EQ(s.resources.gpu_product, "NVIDIA-H200");
  EXPECT_EQ(s.resources.nodes, 2);
  EXPECT_EQ(s.replicas.min, 0);
  EXPECT_EQ(s.replicas.max, 8);
  EXPECT_EQ(s.autoscaling.metric, "queue_time");
  EXPECT_EQ(s.autoscaling.target, 0.5);
  EXPECT_EQ(s.autoscaling.up_after_s, 45);
  EXPECT_EQ(s.autoscaling.down_after_s, 600);
  EXPECT_EQ(s.autoscaling.prometheus, "http://prometheus.monitoring:9090");
  EXPECT_EQ(s.regions, (std::vector<std::string>{"eu-west", "us-east"}));
  EXPECT_EQ(s.tenants_secret, "mini-tenants");
  EXPECT_EQ(s.gateway.replicas, 3);
}

TEST(DeploySpec, DefaultsFillWhatIsLeftOut) {
  const SpecResult r = parse_deployment_spec("name: a\nimage: img\nmodel: {path: /m}\n");
  ASSERT_TRUE(r.errors.empty()) << describe(r.errors.front());
  const DeploymentSpec d;
  EXPECT_EQ(r.spec.engine.port, d.engine.port);
  EXPECT_EQ(r.spec.engine.startup_timeout_s, 600);
  EXPECT_EQ(r.spec.resources.cpu, d.resources.cpu);
  EXPECT_EQ(r.spec.resources.memory, d.resources.memory);
  EXPECT_EQ(r.spec.resources.gpu_count, 0);
  EXPECT_EQ(r.spec.replicas.min, 1);
  EXPECT_EQ(r.spec.replicas.max, 1);
  EXPECT_EQ(r.spec.autoscaling.metric, "concurrency");
  EXPECT_EQ(r.spec.autoscaling.prometheus, d.autoscaling.prometheus);
  EXPECT_EQ(r.spec.gateway.replicas, 2);
  // max follows min when only min is given.
  EXPECT_EQ(parse_deployment_spec("name: a\nimage: img\nmodel: {path: /m}\nreplicas: {min: 3}\n").spec.replicas.max, 3);
}

TEST(DeploySpec, TheCommentedExampleIsValid) {
  std::ifstream in(std::string(BASALT_SOURCE_DIR) + "/deploy/basalt.yaml");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const SpecResult r = parse_deployment_spec(text.str());
  EXPECT_TRUE(r.errors.empty()) << (r.errors.empty() ? "" : describe(r.errors.front()));
  EXPECT_FALSE(r.spec.name.empty());
}

struct BadCase {
  std::string yaml;  // the line that replaces one of kFull's
  std::string path;
  std::string message_part;
};

// kFull with `old_line` replaced by `new_line`.
std::string with_line(const std::string& old_line, const std::string& new_line) {
  std::string s = kFull;
  const size_t at = s.find(old_line);
  EXPECT_NE(at, std::string::npos) << old_line;
  return s.replace(at, old_line.size(), new_line);
}

TEST(DeploySpec, EveryBadFieldIsNamedWithItsLine) {
  const std::vector<std::pair<BadCase, std::string>> cases = {
      {{"name: Mini_1", "name", "lowercase DNS label"}, "name: mini"},
      {{"name: " + std::string(51, 'a'), "name", "at most 50"}, "name: mini"},
      {{"name: \"\"", "name", "empty"}, "name: mini"},
      {{"name: !", "name", "empty"}, "name: mini"},  // a bare tag: the fuzzer's find
      {{"image: ''", "image", "empty"}, "image: registry.example/basalt:0.1-cpu"},
      {{"  path: \"\"", "model.path", "empty"}, "  path: /models/basalt-mini"},
      {{"  volume: {pvc: \"\"}", "model.volume.pvc", "empty"}, "  volume: {pvc: models}"},
      {{"image: \"a b\"", "image", "whitespace"}, "image: registry.example/basalt:0.1-cpu"},
      {{"  path: models/mini", "model.path", "absolute path"}, "  path: /models/basalt-mini"},
      {{"  path: /other/mini", "model.path", "under /models/"}, "  path: /models/basalt-mini"},
      {{"  volume: {pvc: Models}", "model.volume.pvc", "PersistentVolumeClaim"},
       "  volume: {pvc: models}"},
      {{"  args: [\"--port\", \"1\", \"--tp\", \"4\"]", "engine.args[0]", "set by the rendered manifests"},
       "  args: [\"--max-running\", \"64\", \"--fp8-compute=w8a16\", \"--tp\", \"4\"]"},
      {{"  args: [\"--model=/x\", \"--tp\", \"4\"]", "engine.args[0]", "--model"},
       "  args: [\"--max-running\", \"64\", \"--fp8-compute=w8a16\", \"--tp\", \"4\"]"},
      {{"  args: [\"--node-rank\", \"1\", \"--tp\", \"4\"]", "engine.args[0]", "set by the rendered manifests (resources.nodes)"},
       "  args: [\"--max-running\", \"64\", \"--fp8-compute=w8a16\", \"--tp\", \"4\"]"},
      {{"  args: --max-running 4", "engine.args", "list"},
       "  args: [\"--max-running\", \"64\", \"--fp8-compute=w8a16\", \"--tp\", \"4\"]"},
      {{"  port: 70000", "engine.port", "outside [1, 65535]"}, "  port: 9000"},
      {{"  port: 80.5", "engine.port", "not an integer"}, "  port: 9000"},
      {{"  startup_timeout: 600", "engine.startup_timeout", "duration"}, "  startup_timeout: 20m"},
      {{"  startup_timeout: 25h", "engine.startup_timeout", "at most a day"}, "  startup_timeout: 20m"},
      {{"  startup_timeout: 0s", "engine.startup_timeout", "above 0"}, "  startup_timeout: 20m"},
      {{"  cpu: four", "resources.cpu", "CPU quantity"}, "  cpu: 500m"},
      {{"  cpu: 0", "resources.cpu", "above 0"}, "  cpu: 500m"},
      {{"  memory: 16GB", "resources.memory", "memory quantity"}, "  memory: 16Gi"},
      {{"  memory: 500m", "resources.memory", "memory quantity"}, "  memory: 16Gi"},
      {{"  gpu: {count: 17, product: NVIDIA-H200}", "resources.gpu.count", "outside [0, 16]"},
       "  gpu: {count: 2, product: NVIDIA-H200}"},
      {{"  gpu: {count: 2, product: \"H 200\"}", "resources.gpu.product", "node label value"},
       "  gpu: {count: 2, product: NVIDIA-H200}"},
      {{"  gpu: {count: 2, kind: h200}", "resources.gpu.kind", "unknown key"},
       "  gpu: {count: 2, product: NVIDIA-H200}"},
      {{"  nodes: 0", "resources.nodes", "outside [1, 64]"}, "  nodes: 2"},
      {{"  args: [\"--max-running\", \"64\"]", "engine.args", "give --tp 4 (no --tp given)"}, "  args: [\"--max-running\", \"64\", \"--fp8-compute=w8a16\", \"--tp\", \"4\"]"},
      {{"  args: [\"--tp=4\", \"--dp-attention\"]", "engine.args", "--dp-attention runs over the GPUs of one node"},
       "  args: [\"--max-running\", \"64\", \"--fp8-compute=w8a16\", \"--tp\", \"4\"]"},
      {{"replicas: {min: 5, max: 2}", "replicas.max", "below replicas.min (5)"},
       "replicas: {min: 0, max: 8}"},
      {{"replicas: {min: -1, max: 2}", "replicas.min", "outside [0, 1000]"},
       "replicas: {min: 0, max: 8}"},
      {{"  metric: gpu_util", "autoscaling.metric", "not concurrency, queue_time or ttft_p95"},
       "  metric: queue_time"},
      {{"  target: 0", "autoscaling.target", "above 0"}, "  target: 0.5"},
      {{"  target: fast", "autoscaling.target", "not a number"}, "  target: 0.5"},
      {{"  up_after: 45", "autoscaling.up_after", "duration"}, "  up_after: 45s"},
      {{"  down_after: 2d", "autoscaling.down_after", "duration"}, "  down_after: 10m"},
      {{"  prometheus: prometheus:9090", "autoscaling.prometheus", "http:// or https:// URL"},
       "  prometheus: http://prometheus.monitoring:9090"},
      {{"  prometheus: \"http://\"", "autoscaling.prometheus", "http:// or https:// URL"},
       "  prometheus: http://prometheus.monitoring:9090"},
      {{"  prometheus: \"http://a b\"", "autoscaling.prometheus", "http:// or https:// URL"},
       "  prometheus: http://prometheus.monitoring:9090"},
      {{"  prometheus: [http://a]", "autoscaling.prometheus", "single value"},
       "  prometheus: http://prometheus.monitoring:9090"},
      {{"regions: [eu-west, eu-west]", "regions[1]", "listed twice"},
       "regions: [eu-west, us-east]"},
      {{"regions: [\"eu west\"]", "regions[0]", "region label value"},
       "regions: [eu-west, us-east]"},
      {{"regions: eu-west", "regions", "list"}, "regions: [eu-west, us-east]"},
      {{"tenants: {secret: Mini}", "tenants.secret", "Secret name"},
       "tenants: {secret: mini-tenants}"},
      {{"tenants: {secret: mini-tenants, file: x}", "tenants.file", "unknown key"},
       "tenants: {secret: mini-tenants}"},
      {{"gateway: {replicas: 0}", "gateway.replicas", "outside [1, 100]"},
       "gateway: {replicas: 3}"},
      {{"gateway: [1]", "gateway", "mapping"}, "gateway: {replicas: 3}"},
  };
  for (const auto& [bad, original] : cases) {
    SCOPED_TRACE(bad.yaml);
    const std::string text = with_line(original, bad.yaml);
    const SpecResult r = parse_deployment_spec(text);
    ASSERT_EQ(r.errors.size(), 1u) << (r.errors.empty() ? "no error" : describe(r.errors.front()));
    EXPECT_EQ(r.errors[0].path, bad.path) << describe(r.errors[0]);
    EXPECT_NE(r.errors[0].message.find(bad.message_part), std::string::npos) << describe(r.errors[0]);
    // The line is the bad value's (or its key's).
    const size_t at = text.find(bad.yaml);
    const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<long>(at), '\n'));
    EXPECT_EQ(r.errors[0].line, line) << describe(r.errors[0]);
  }
}

TEST(DeploySpec, MissingRequiredFieldsAndUnknownKeysAreAllReported) {
  const SpecResult r = parse_deployment_spec("replica: 3\nengine: {port: 0}\n");
  std::vector<std::string> paths;
  for (const SpecError& e : r.errors) paths.push_back(e.path);
  // In file order, the missing fields (no line) last.
  EXPECT_EQ(paths, (std::vector<std::string>{"replica", "engine.port", "name", "image", "model.path"}));
  EXPECT_EQ(describe(r.errors[0]), "line 1: replica: unknown key (expected one of: name, image, model, engine, "
                                   "resources, replicas, autoscaling, regions, tenants, gateway)");
  EXPECT_EQ(describe(r.errors[1]), "line 2: engine.port: 0 is outside [1, 65535]");
  EXPECT_EQ(describe(r.errors[2]), "name: required");
}

TEST(DeploySpec, MalformedYamlAndOtherDocumentsAreOneClearError) {
  SpecResult r = parse_deployment_spec("name: [unclosed\n");
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_NE(r.errors[0].message.find("not valid YAML"), std::string::npos);
  EXPECT_GT(r.errors[0].line, 0);
  for (const char* text : {"", "- a\n- b\n", "just text\n"}) {
    r = parse_deployment_spec(text);
    ASSERT_EQ(r.errors.size(), 1u) << text;
    EXPECT_NE(r.errors[0].message.find("one mapping"), std::string::npos);
  }
  // Too large, or nested too deep for a spec (the parser recurses per level).
  r = parse_deployment_spec("name: " + std::string(2u << 20, 'a') + "\n");
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_NE(r.errors[0].message.find("at most 1048576"), std::string::npos);
  r = parse_deployment_spec("name: a\nx: " + std::string(100000, '[') + "\n");
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_NE(r.errors[0].message.find("nested more than 64"), std::string::npos);
  // Brackets inside quotes and comments do not count.
  r = parse_deployment_spec("name: a\nimage: \"" + std::string(100, '[') + "\"\nmodel: {path: /m}  # " +
                            std::string(100, '{') + "\n");
  EXPECT_TRUE(r.errors.empty()) << describe(r.errors.front());
  // A replica spanning nodes needs GPUs; a GPU product needs a count.
  r = parse_deployment_spec("name: a\nimage: i\nmodel: {path: /m}\nresources: {nodes: 2, gpu: {product: X}}\n");
  ASSERT_EQ(r.errors.size(), 2u);
  EXPECT_EQ(r.errors[0].path, "resources.gpu.product");
  EXPECT_EQ(r.errors[1].path, "resources.nodes");
  // Over several nodes every GPU is a rank: --tp follows nodes x gpu.count
  // (the error is engine.args', at its line).
  r = parse_deployment_spec(with_line("  nodes: 2", "  nodes: 3"));
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0].path, "engine.args");
  EXPECT_EQ(r.errors[0].line, 7);
  EXPECT_NE(r.errors[0].message.find("a replica over 3 nodes of 2 GPUs runs its 6 GPUs as ranks: give --tp 6 (--tp is 4)"),
            std::string::npos);
  EXPECT_TRUE(parse_deployment_spec(with_line("  nodes: 2", "  nodes: 1")).errors.empty());
  // Seconds metrics need their own target.
  r = parse_deployment_spec("name: a\nimage: i\nmodel: {path: /m}\nautoscaling: {metric: ttft_p95}\n");
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0].path, "autoscaling.target");
}

}  // namespace
}  // namespace basalt::deploy

// render_manifests: each spec field lands where it should in the object
// trees (the GPU request and node selector, probes, the grace period from
// the drain timeout, the preStop sleep, zone spread, the non-root read-only
// pods, the autoscalers' bounds and queries, the tenants Secret, regions),
// what cannot be rendered is refused with the field's path, and to_yaml's
// text reads back as the same tree.
#include "deploy/render.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <string>

namespace basalt::deploy {
namespace {

using Json = nlohmann::ordered_json;

const char* kGpuSpec = R"(name: big
image: registry.example/basalt:0.1-cuda
model:
  path: /models/llama-8b
  volume: {pvc: weights}
engine:
  args: ["--max-running", "128", "--drain-timeout=60"]
  port: 9000
resources:
  cpu: "8"
  memory: 64Gi
  gpu: {count: 2, product: NVIDIA-H200}
replicas: {min: 2, max: 10}
autoscaling:
  metric: queue_time
  target: 0.5
  up_after: 45s
  down_after: 10m
  prometheus: http://prom.monitoring:9090
regions: [eu-west, eu-north]
tenants: {secret: big-tenants}
gateway: {replicas: 3}
)";

DeploymentSpec spec_of(const std::string& yaml) {
  const SpecResult r = parse_deployment_spec(yaml);
  EXPECT_TRUE(r.errors.empty()) << (r.errors.empty() ? "" : describe(r.errors.front()));
  return r.spec;
}

std::vector<Json> render_ok(const std::string& yaml, RenderOptions options = {}) {
  const RenderResult r = render_manifests(spec_of(yaml), options);
  EXPECT_TRUE(r.errors.empty()) << (r.errors.empty() ? "" : describe(r.errors.front()));
  return r.objects;
}

const Json& find(const std::vector<Json>& objects, const std::string& kind,
                 const std::string& name) {
  for (const Json& o : objects)
    if (o["kind"] == kind && o["metadata"]["name"] == name) return o;
  ADD_FAILURE() << "no " << kind << " " << name;
  static const Json none = Json::object();
  return none;
}

const Json& pod_spec(const Json& deployment) { return deployment["spec"]["template"]["spec"]; }
const Json& container(const Json& deployment) { return pod_spec(deployment)["containers"][0]; }

TEST(DeployRender, WritesTheObjectsInOrderInTheNamespace) {
  RenderOptions options;
  options.namespace_name = "serving";
  const std::vector<Json> objects = render_ok(kGpuSpec, options);
  std::vector<std::string> kinds;
  for (const Json& o : objects) {
    kinds.push_back(o["kind"].get<std::string>() + "/" + o["metadata"]["name"].get<std::string>());
    EXPECT_EQ(o["metadata"]["namespace"], "serving");
    EXPECT_EQ(o["metadata"]["labels"]["app.kubernetes.io/instance"], "big");
  }
  EXPECT_EQ(kinds,
            (std::vector<std::string>{"Deployment/big-engine", "Service/big-engine",
                                      "PodDisruptionBudget/big-engine", "Deployment/big-gateway",
                                      "Service/big-gateway", "PodDisruptionBudget/big-gateway",
                                      "ScaledObject/big-engine"}));
}

TEST(DeployRender, TheEngineRunsServeWithTheSpecsFlagsAndResources) {
  const std::vector<Json> objects = render_ok(kGpuSpec);
  const Json& engine = find(objects, "Deployment", "big-engine");
  const Json& c = container(engine);
  EXPECT_EQ(c["image"], "registry.example/basalt:0.1-cuda");
  EXPECT_EQ(c["command"], Json::array({"basalt"}));
  EXPECT_EQ(c["args"],
            Json::array({"serve", "--host", "0.0.0.0", "--port", "9000", "--model",
                         "/models/llama-8b", "--max-running", "128", "--drain-timeout=60"}));
  EXPECT_EQ(c["ports"][0]["containerPort"], 9000);
  EXPECT_EQ(c["resources"]["requests"]["cpu"], "8");
  EXPECT_EQ(c["resources"]["requests"]["memory"], "64Gi");
  EXPECT_EQ(c["resources"]["requests"]["nvidia.com/gpu"], "2");
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"], "2");
  EXPECT_EQ(c["resources"]["limits"]["memory"], "64Gi");
  EXPECT_FALSE(c["resources"]["limits"].contains("cpu"));
  const Json& pod = pod_spec(engine);
  EXPECT_EQ(pod["nodeSelector"]["nvidia.com/gpu.product"], "NVIDIA-H200");
  EXPECT_EQ(pod["tolerations"][0]["key"], "nvidia.com/gpu");
  // The model's volume, read-only at /models.
  EXPECT_EQ(pod["volumes"][1]["persistentVolumeClaim"]["claimName"], "weights");
  EXPECT_EQ(c["volumeMounts"][1]["mountPath"], "/models");
  EXPECT_EQ(c["volumeMounts"][1]["readOnly"], true);
  // Prometheus finds the replica's /metrics on its port.
  EXPECT_EQ(engine["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"], "9000");
  // An autoscaler owns the count.
  EXPECT_FALSE(engine["spec"].contains("replicas"));
}

TEST(DeployRender, ACpuEngineHasNoGpuRequestNodeSelectorOrVolume) {
  const std::vector<Json> objects = render_ok("name: a\nimage: img\nmodel: {path: /m}\n");
  const Json& engine = find(objects, "Deployment", "a-engine");
  EXPECT_FALSE(container(engine)["resources"]["requests"].contains("nvidia.com/gpu"));
  EXPECT_FALSE(pod_spec(engine).contains("nodeSelector"));
  EXPECT_FALSE(pod_spec(engine).contains("tolerations"));
  EXPECT_FALSE(pod_spec(engine).contains("affinity"));
  EXPECT_EQ(pod_spec(engine)["volumes"].size(), 1u);  // /tmp only
  // min == max: a fixed count and no autoscaler.
  EXPECT_EQ(engine["spec"]["replicas"], 1);
  EXPECT_EQ(objects.size(), 6u);
  EXPECT_EQ(objects.back()["kind"], "PodDisruptionBudget");
}

TEST(DeployRender, ProbesDrainAndPreStopFollowTheDrainTimeout) {
  const std::vector<Json> objects = render_ok(kGpuSpec);
  const Json& engine = find(objects, "Deployment", "big-engine");
  const Json& c = container(engine);
  EXPECT_EQ(c["startupProbe"]["httpGet"]["path"], "/ready");
  // Asked every second, for engine.startup_timeout (default 10 minutes).
  EXPECT_EQ(c["startupProbe"]["periodSeconds"], 1);
  EXPECT_EQ(c["startupProbe"]["timeoutSeconds"], 1);
  EXPECT_EQ(c["startupProbe"]["failureThreshold"], 600);
  std::string short_start = kGpuSpec;
  short_start.replace(short_start.find("  port: 9000\n"), 13, "  port: 9000\n  startup_timeout: 90.5s\n");
  const std::vector<Json> quick = render_ok(short_start);
  EXPECT_EQ(container(find(quick, "Deployment", "big-engine"))["startupProbe"]["failureThreshold"], 91);
  EXPECT_EQ(c["readinessProbe"]["httpGet"]["path"], "/ready");
  EXPECT_EQ(c["livenessProbe"]["httpGet"]["path"], "/health");
  EXPECT_EQ(c["livenessProbe"]["httpGet"]["port"], "http");
  EXPECT_EQ(c["lifecycle"]["preStop"]["exec"]["command"], Json::array({"sleep", "5"}));
  EXPECT_EQ(pod_spec(engine)["terminationGracePeriodSeconds"], 60 + 15);
  // serve's default drain (30 s), and a fractional one given as two arguments.
  const std::string plain = "name: a\nimage: img\nmodel: {path: /m}\n";
  EXPECT_EQ(pod_spec(render_ok(plain)[0])["terminationGracePeriodSeconds"], 45);
  EXPECT_EQ(
      pod_spec(render_ok(
          plain +
          "engine: {args: [--drain-timeout, \"12.5\"]}\n")[0])["terminationGracePeriodSeconds"],
      13 + 15);
  // The gateway drains for route's default and also sleeps before SIGTERM.
  const Json& gateway = find(objects, "Deployment", "big-gateway");
  EXPECT_EQ(pod_spec(gateway)["terminationGracePeriodSeconds"], 45);
  EXPECT_EQ(container(gateway)["lifecycle"]["preStop"]["exec"]["command"],
            Json::array({"sleep", "5"}));
  EXPECT_EQ(container(gateway)["readinessProbe"]["httpGet"]["path"], "/ready");
}

TEST(DeployRender, PodsRunAsNonRootWithAReadOnlyRootAndSpreadOverZones) {
  const std::vector<Json> objects = render_ok(kGpuSpec);
  for (const char* name : {"big-engine", "big-gateway"}) {
    SCOPED_TRACE(name);
    const Json& d = find(objects, "Deployment", name);
    const Json& pod = pod_spec(d);
    EXPECT_EQ(pod["securityContext"]["runAsNonRoot"], true);
    EXPECT_EQ(pod["securityContext"]["runAsUser"], kImageUserId);
    EXPECT_EQ(pod["automountServiceAccountToken"], false);
    const Json& sc = container(d)["securityContext"];
    EXPECT_EQ(sc["readOnlyRootFilesystem"], true);
    EXPECT_EQ(sc["allowPrivilegeEscalation"], false);
    EXPECT_EQ(sc["capabilities"]["drop"], Json::array({"ALL"}));
    EXPECT_EQ(container(d)["volumeMounts"][0]["mountPath"], "/tmp");
    const Json& spread = pod["topologySpreadConstraints"][0];
    EXPECT_EQ(spread["topologyKey"], "topology.kubernetes.io/zone");
    EXPECT_EQ(spread["whenUnsatisfiable"], "ScheduleAnyway");
    // The spread counts this Deployment's own pods.
    EXPECT_EQ(spread["labelSelector"]["matchLabels"], d["spec"]["selector"]["matchLabels"]);
    EXPECT_EQ(d["spec"]["template"]["metadata"]["labels"], d["spec"]["selector"]["matchLabels"]);
    // Only the regions' nodes.
    const Json& term =
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
           ["nodeSelectorTerms"][0]["matchExpressions"][0];
    EXPECT_EQ(term["key"], "topology.kubernetes.io/region");
    EXPECT_EQ(term["values"], Json::array({"eu-west", "eu-north"}));
  }
}

TEST(DeployRender, ServicesAndDisruptionBudgetsSelectTheirPods) {
  RenderOptions options;
  options.namespace_name = "serving";
  const std::vector<Json> objects = render_ok(kGpuSpec, options);
  const Json& engine_service = find(objects, "Service", "big-engine");
  EXPECT_EQ(engine_service["spec"]["clusterIP"], "None");
  EXPECT_EQ(engine_service["spec"]["ports"][0]["port"], 9000);
  EXPECT_EQ(engine_service["spec"]["selector"],
            find(objects, "Deployment", "big-engine")["spec"]["selector"]["matchLabels"]);
  const Json& pdb = find(objects, "PodDisruptionBudget", "big-engine");
  EXPECT_EQ(pdb["spec"]["maxUnavailable"], 1);
  EXPECT_EQ(pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"], "engine");
  const Json& gateway = find(objects, "Deployment", "big-gateway");
  EXPECT_EQ(gateway["spec"]["replicas"], 3);
  EXPECT_EQ(find(objects, "Service", "big-gateway")["spec"]["selector"],
            gateway["spec"]["selector"]["matchLabels"]);
  // The gateway finds the replicas through the engine Service's name.
  const Json& args = container(gateway)["args"];
  EXPECT_EQ(args[0], "route");
  const auto dns = std::find(args.begin(), args.end(), Json("--replica-dns"));
  ASSERT_NE(dns, args.end()) << args;
  EXPECT_EQ(*(dns + 1), "big-engine.serving.svc:9000");
}

TEST(DeployRender, TheTenantsSecretIsMountedAndGivenToTheGateway) {
  const std::vector<Json> objects = render_ok(kGpuSpec);
  const Json& gateway = find(objects, "Deployment", "big-gateway");
  const Json& args = container(gateway)["args"];
  const auto flag = std::find(args.begin(), args.end(), Json("--tenants-file"));
  ASSERT_NE(flag, args.end());
  EXPECT_EQ(*(flag + 1), "/etc/basalt/tenants/tenants.json");
  EXPECT_EQ(pod_spec(gateway)["volumes"][1]["secret"]["secretName"], "big-tenants");
  EXPECT_EQ(pod_spec(gateway)["volumes"][1]["secret"]["items"][0]["key"], "tenants.json");
  EXPECT_EQ(container(gateway)["volumeMounts"][1]["mountPath"], "/etc/basalt/tenants");
  // Without a Secret, no flag and no volume.
  const Json plain = render_ok("name: a\nimage: img\nmodel: {path: /m}\n")[3];
  EXPECT_EQ(plain["kind"], "Deployment");
  EXPECT_EQ(container(plain)["args"].dump().find("tenants"), std::string::npos);
}

TEST(DeployRender, KedaScalesToTheCountTheGatewaysAutoscalerWants) {
  RenderOptions options;
  options.namespace_name = "serving";
  const std::vector<Json> objects = render_ok(kGpuSpec, options);
  const Json& so = find(objects, "ScaledObject", "big-engine");
  EXPECT_EQ(so["apiVersion"], "keda.sh/v1alpha1");
  EXPECT_EQ(so["spec"]["scaleTargetRef"]["name"], "big-engine");
  EXPECT_EQ(so["spec"]["minReplicaCount"], 2);
  EXPECT_EQ(so["spec"]["maxReplicaCount"], 10);
  EXPECT_EQ(so["spec"]["cooldownPeriod"], 30);
  // The gateways' count has waited up_after and down_after already.
  const Json& behavior = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"];
  EXPECT_EQ(behavior["scaleUp"]["stabilizationWindowSeconds"], 0);
  EXPECT_EQ(behavior["scaleDown"]["stabilizationWindowSeconds"], 0);
  EXPECT_EQ(behavior["scaleDown"]["policies"][0]["value"], 1);
  EXPECT_EQ(behavior["scaleDown"]["policies"][0]["periodSeconds"], 600);
  const Json& trigger = so["spec"]["triggers"][0];
  EXPECT_EQ(trigger["type"], "prometheus");
  EXPECT_EQ(trigger["metricType"], "AverageValue");
  EXPECT_EQ(trigger["metadata"]["serverAddress"], "http://prom.monitoring:9090");
  EXPECT_EQ(trigger["metadata"]["threshold"], "1");
  EXPECT_EQ(trigger["metadata"]["ignoreNullValues"], "false");
  EXPECT_EQ(trigger["metadata"]["query"],
            "max(basalt_route_desired_replicas{namespace=\"serving\",pod=~\"big-gateway-.+\"})");
  // The gateways compute that count from the spec's metric, target, bounds and times.
  const Json& args = container(find(objects, "Deployment", "big-gateway"))["args"];
  const auto flag = std::find(args.begin(), args.end(), Json("--autoscale"));
  ASSERT_NE(flag, args.end()) << args;
  EXPECT_EQ(*(flag + 1), "metric=queue_time target=0.5 min=2 max=10 up_after=45s down_after=600s");
  // A fixed size has no autoscaler, in Kubernetes or in the gateway.
  const std::vector<Json> fixed = render_ok("name: a\nimage: img\nmodel: {path: /m}\nreplicas: {min: 2, max: 2}\n");
  EXPECT_EQ(container(fixed[3])["args"].dump().find("--autoscale"), std::string::npos);
  for (const Json& o : fixed) EXPECT_NE(o["kind"], "ScaledObject");

  // Scale to zero, on any metric: the gateways hold the first requests and count 1 for them.
  for (const char* autoscaling : {"", "autoscaling: {metric: ttft_p95, target: 1}\n"}) {
    const std::string yaml = std::string("name: a\nimage: img\nmodel: {path: /m}\nreplicas: {min: 0, max: 3}\n") +
                             autoscaling;
    const std::vector<Json> zero = render_ok(yaml);
    EXPECT_EQ(zero.back()["spec"]["minReplicaCount"], 0);
    EXPECT_EQ(zero.back()["spec"]["triggers"][0]["metadata"]["activationThreshold"], "0");
    // The gateway stays in its Service while no replica is ready.
    EXPECT_EQ(container(zero[3])["readinessProbe"]["httpGet"]["path"], "/health");
  }
}

TEST(DeployRender, TheHpaReadsTheGatewaysCountAsAnExternalMetric) {
  RenderOptions options;
  options.autoscaler = Autoscaler::kHpa;
  const std::vector<Json> objects = render_ok(kGpuSpec, options);
  const Json& hpa = find(objects, "HorizontalPodAutoscaler", "big-engine");
  EXPECT_EQ(hpa["apiVersion"], "autoscaling/v2");
  EXPECT_EQ(hpa["spec"]["minReplicas"], 2);
  EXPECT_EQ(hpa["spec"]["maxReplicas"], 10);
  EXPECT_EQ(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");
  const Json& metric = hpa["spec"]["metrics"][0];
  EXPECT_EQ(metric["type"], "External");
  EXPECT_EQ(metric["external"]["metric"]["name"], "basalt_route_desired_replicas");
  EXPECT_EQ(metric["external"]["target"], (Json{{"type", "AverageValue"}, {"averageValue", "1"}}));
  EXPECT_EQ(hpa["spec"]["behavior"]["scaleUp"]["stabilizationWindowSeconds"], 0);
}

TEST(DeployRender, WhatCannotBeRenderedIsRefusedWithItsField) {
  const std::string base = "name: a\nimage: img\nmodel: {path: /m}\n";
  // Options as plain fields: GCC 12 at -O3 warns (maybe-uninitialized) on
  // a braced RenderOptions inside this table.
  struct Case {
    std::string yaml;
    Autoscaler autoscaler;
    std::string namespace_name;
    std::string path;
    std::string message_part;
  };
  const Autoscaler keda = Autoscaler::kKeda, hpa = Autoscaler::kHpa;
  const std::vector<Case> cases = {
      {base + "replicas: {min: 0, max: 2}\n", hpa, "default", "replicas.min", "--autoscaler keda"},
      {base + "engine: {args: [--drain-timeout, soon]}\n", keda, "default", "engine.args[0]",
       "--drain-timeout 'soon'"},
      {base + "engine: {args: [--drain-timeout]}\n", keda, "default", "engine.args[0]",
       "not seconds"},
      {base + "engine: {args: [--drain-timeout=-1]}\n", keda, "default", "engine.args[0]",
       "not seconds"},
      {base, keda, "Serving", "--namespace", "DNS label"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml);
    RenderOptions options;
    options.autoscaler = c.autoscaler;
    options.namespace_name = c.namespace_name;
    const RenderResult r = render_manifests(spec_of(c.yaml), options);
    EXPECT_TRUE(r.objects.empty());
    ASSERT_EQ(r.errors.size(), 1u);
    EXPECT_EQ(r.errors[0].path, c.path);
    EXPECT_NE(r.errors[0].message.find(c.message_part), std::string::npos) << r.errors[0].message;
  }
  // A long window is fine when nothing autoscales.
  EXPECT_TRUE(
      render_manifests(spec_of(base + "autoscaling: {down_after: 2h}\n"), {}).errors.empty());
}

// resources.nodes > 1: a LeaderWorkerSet of groups of a leader (the server,
// node 0) and workers that join it at the address LeaderWorkerSet gives
// them; the Service lists leaders only; the autoscaler scales the set.
TEST(DeployRender, AReplicaOverSeveralNodesIsALeaderWorkerSet) {
  std::string yaml = kGpuSpec;
  yaml.replace(yaml.find("gpu: {count: 2, product: NVIDIA-H200}"), 37,
               "gpu: {count: 8, product: NVIDIA-H200}\n  nodes: 3");
  yaml.replace(yaml.find(R"(args: ["--max-running", "128")"), 29, R"(args: ["--max-running", "128", "--tp", "24")");
  const std::vector<Json> objects = render_ok(yaml);
  EXPECT_EQ(objects[0]["kind"], "LeaderWorkerSet");
  for (const Json& o : objects)  // the set in place of the engine's Deployment
    EXPECT_FALSE(o["kind"] == "Deployment" && o["metadata"]["name"] == "big-engine");
  const Json& lws = find(objects, "LeaderWorkerSet", "big-group");
  EXPECT_EQ(lws["apiVersion"], "leaderworkerset.x-k8s.io/v1");
  EXPECT_FALSE(lws["spec"].contains("replicas"));  // autoscaled
  EXPECT_EQ(lws["spec"]["startupPolicy"], "LeaderCreated");
  EXPECT_EQ(lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"], (Json{{"maxUnavailable", 0}, {"maxSurge", 1}}));
  const Json& group = lws["spec"]["leaderWorkerTemplate"];
  EXPECT_EQ(group["size"], 3);
  EXPECT_EQ(group["restartPolicy"], "RecreateGroupOnPodRestart");
  const Json& leader = group["leaderTemplate"]["spec"]["containers"][0];
  const Json& worker = group["workerTemplate"]["spec"]["containers"][0];
  const auto args_text = [](const Json& c) {
    std::string text;
    for (const Json& a : c["args"]) text += " " + a.get<std::string>();
    return text;
  };
  EXPECT_EQ(args_text(leader), " serve --host 0.0.0.0 --port 9000 --model /models/llama-8b --max-running 128 "
                               "--tp 24 --drain-timeout=60 --nnodes 3 --node-rank 0 --dist-init-addr 0.0.0.0:29500");
  EXPECT_EQ(args_text(worker), " serve --model /models/llama-8b --max-running 128 --tp 24 --drain-timeout=60 "
                               "--nnodes 3 --node-rank $(LWS_WORKER_INDEX) --dist-init-addr "
                               "$(LWS_LEADER_ADDRESS):29500");
  // The leader is the replica the gateway sees: probes, preStop, metrics.
  EXPECT_EQ(leader["startupProbe"]["httpGet"]["path"], "/ready");
  EXPECT_EQ(leader["ports"][1], (Json{{"name", "nodes"}, {"containerPort", kNodeLinkPort}, {"protocol", "TCP"}}));
  EXPECT_EQ(group["leaderTemplate"]["metadata"]["annotations"]["prometheus.io/port"], "9000");
  EXPECT_EQ(group["leaderTemplate"]["spec"]["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"]
                ["leaderworkerset.sigs.k8s.io/worker-index"],
            "0");
  // A group's pods stay in one zone: each requires one of its own group's
  // (the group key added to the selector by matchLabelKeys) in its zone.
  const Json& together = group["leaderTemplate"]["spec"]["affinity"]["podAffinity"]
                              ["requiredDuringSchedulingIgnoredDuringExecution"];
  ASSERT_EQ(together.size(), 1u) << together;
  EXPECT_EQ(together[0]["matchLabelKeys"], Json::array({"leaderworkerset.sigs.k8s.io/group-key"}));
  EXPECT_EQ(together[0]["topologyKey"], "topology.kubernetes.io/zone");
  EXPECT_EQ(together[0]["labelSelector"]["matchLabels"]["app.kubernetes.io/component"], "engine");
  EXPECT_TRUE(group["leaderTemplate"]["spec"]["affinity"].contains("nodeAffinity"));  // the regions' too
  // A worker serves nothing: no ports, probes or preStop; the same GPUs,
  // volumes, placement and grace as its leader.
  for (const char* key : {"ports", "startupProbe", "readinessProbe", "livenessProbe", "lifecycle"})
    EXPECT_FALSE(worker.contains(key)) << key;
  EXPECT_EQ(worker["resources"], leader["resources"]);
  EXPECT_EQ(worker["resources"]["limits"]["nvidia.com/gpu"], "8");
  EXPECT_EQ(worker["volumeMounts"], leader["volumeMounts"]);
  const Json& worker_pod = group["workerTemplate"]["spec"];
  const Json& leader_pod = group["leaderTemplate"]["spec"];
  for (const char* key : {"terminationGracePeriodSeconds", "nodeSelector", "tolerations", "affinity", "volumes",
                          "securityContext"})
    EXPECT_EQ(worker_pod[key], leader_pod[key]) << key;
  EXPECT_EQ(leader_pod["terminationGracePeriodSeconds"], 75);
  EXPECT_FALSE(group["workerTemplate"]["metadata"].contains("annotations"));
  const Json& service = find(objects, "Service", "big-engine");
  EXPECT_EQ(service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"], "0");
  EXPECT_EQ(service["spec"]["selector"]["app.kubernetes.io/component"], "engine");
  const Json& scaled = find(objects, "ScaledObject", "big-engine");
  EXPECT_EQ(scaled["spec"]["scaleTargetRef"],
            (Json{{"apiVersion", "leaderworkerset.x-k8s.io/v1"}, {"kind", "LeaderWorkerSet"}, {"name", "big-group"}}));
  RenderOptions hpa;
  hpa.autoscaler = Autoscaler::kHpa;
  EXPECT_EQ(find(render_ok(yaml, hpa), "HorizontalPodAutoscaler", "big-engine")["spec"]["scaleTargetRef"]["kind"],
            "LeaderWorkerSet");
  // A fixed size: the set carries it.
  yaml.replace(yaml.find("replicas: {min: 2, max: 10}"), 27, "replicas: {min: 2, max: 2}");
  EXPECT_EQ(find(render_ok(yaml), "LeaderWorkerSet", "big-group")["spec"]["replicas"], 2);
  EXPECT_EQ(manifest_file_name(render_ok(yaml)[0]), "leaderworkerset-big-group.yaml");
}

// The YAML text as a tree: quoted scalars are strings, plain ones are
// typed as a YAML reader types them.
Json tree_of(const YAML::Node& node) {
  if (node.IsMap()) {
    Json object = Json::object();
    for (const auto& entry : node) object[entry.first.Scalar()] = tree_of(entry.second);
    return object;
  }
  if (node.IsSequence()) {
    Json array = Json::array();
    for (const auto& item : node) array.push_back(tree_of(item));
    return array;
  }
  if (node.IsNull()) return nullptr;
  const std::string& text = node.Scalar();
  if (node.Tag() == "!") return text;
  if (text == "true" || text == "false") return text == "true";
  try {
    size_t used = 0;
    const long long n = std::stoll(text, &used);
    if (used == text.size()) return n;
    const double d = std::stod(text, &used);
    if (used == text.size()) return d;
  } catch (const std::exception&) {
  }
  return text;
}

TEST(DeployRender, YamlTextReadsBackAsTheSameTree) {
  for (const Json& object : render_ok(kGpuSpec)) {
    SCOPED_TRACE(object["kind"].get<std::string>());
    const std::string text = to_yaml(object);
    EXPECT_EQ(tree_of(YAML::Load(text)), object) << text;
  }
  // Strings that look like other things stay strings.
  const Json tricky = {{"a", "true"},  {"b", "8000"},         {"c", "0.5"},        {"d", ""},
                       {"e", "yes"},   {"f", "null"},         {"g", "1:30"},       {"h", "0x1F"},
                       {"i", "plain"}, {"j", Json::object()}, {"k", Json::array()}};
  const std::string text = to_yaml(tricky);
  EXPECT_EQ(tree_of(YAML::Load(text)), tricky) << text;
  EXPECT_NE(text.find("a: \"true\""), std::string::npos) << text;
  EXPECT_NE(text.find("i: plain"), std::string::npos) << text;
}

TEST(DeployRender, FileNamesCarryKindAndName) {
  const std::vector<Json> objects = render_ok(kGpuSpec);
  EXPECT_EQ(manifest_file_name(objects[0]), "deployment-big-engine.yaml");
  EXPECT_EQ(manifest_file_name(objects[2]), "poddisruptionbudget-big-engine.yaml");
  EXPECT_EQ(manifest_file_name(objects.back()), "scaledobject-big-engine.yaml");
}

}  // namespace
}  // namespace basalt::deploy

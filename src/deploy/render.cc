#include "deploy/render.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string_view>

namespace basalt::deploy {
namespace {

using Json = nlohmann::ordered_json;

constexpr double kDefaultDrainSeconds = 30;  // `basalt serve` and `basalt route`'s --drain-timeout
// The HPA's limit on a scaling policy's period (autoscaling/v2 validation).
constexpr int kMaxPolicyPeriodSeconds = 1800;
constexpr int kProbePeriodSeconds = 5;
// The startup probe asks every second, so that a replica that starts in
// well under a second (the bundled model on the CPU: docs/DEPLOY.md section
// 5) is not kept out of its Service for a whole probe period; its budget is
// engine.startup_timeout.
constexpr int kStartupProbePeriodSeconds = 1;
const char* const kGpuResource = "nvidia.com/gpu";
const char* const kGpuProductLabel = "nvidia.com/gpu.product";
const char* const kTenantsKey = "tenants.json";  // the Secret's key holding `--tenants-file`
const char* const kTenantsDir = "/etc/basalt/tenants";

Json labels(const DeploymentSpec& spec, const char* component) {
  return Json{{"app.kubernetes.io/name", "basalt"},
              {"app.kubernetes.io/instance", spec.name},
              {"app.kubernetes.io/component", component}};
}

Json metadata(const DeploymentSpec& spec, const RenderOptions& options, const std::string& name,
              const char* component) {
  return Json{
      {"name", name}, {"namespace", options.namespace_name}, {"labels", labels(spec, component)}};
}

std::string engine_name(const DeploymentSpec& spec) { return spec.name + "-engine"; }
std::string gateway_name(const DeploymentSpec& spec) { return spec.name + "-gateway"; }
// The LeaderWorkerSet of a replica over several nodes. Not NAME-engine: the
// LWS controller makes a headless Service named as the set (its pods' DNS
// subdomain), which would take the name of ours, which lists leaders only.
std::string group_name(const DeploymentSpec& spec) { return spec.name + "-group"; }
bool spans_nodes(const DeploymentSpec& spec) { return spec.resources.nodes > 1; }

// LeaderWorkerSet's API (leaderworkerset.x-k8s.io/v1): the label on a
// group's pods with their index in it (0: the leader), the label with a key
// of the group's own (the same on its pods, another on each group's), and
// the variables it sets in every container (the leader's address, the
// pod's index).
const char* const kWorkerIndexLabel = "leaderworkerset.sigs.k8s.io/worker-index";
const char* const kGroupKeyLabel = "leaderworkerset.sigs.k8s.io/group-key";
const char* const kLwsApiVersion = "leaderworkerset.x-k8s.io/v1";

// What an engine pod is: a replica on its own, or a replica's leader (the
// server, node 0) or one of its workers (node 1 and on) over several nodes.
enum class EngineRole { kAlone, kLeader, kWorker };

// The engine's --drain-timeout from engine.args (`--drain-timeout 60` or
// `--drain-timeout=60`), else serve's default.
double drain_seconds(const DeploymentSpec& spec, std::vector<SpecError>& errors) {
  const std::string flag = "--drain-timeout";
  double seconds = kDefaultDrainSeconds;
  const std::vector<std::string>& args = spec.engine.args;
  for (size_t i = 0; i < args.size(); ++i) {
    std::optional<std::string> value;
    if (args[i] == flag)
      value = i + 1 < args.size() ? args[i + 1] : std::string();
    else if (args[i].rfind(flag + "=", 0) == 0)
      value = args[i].substr(flag.size() + 1);
    if (!value) continue;
    char* end = nullptr;
    const double parsed = std::strtod(value->c_str(), &end);
    if (value->empty() || *end != '\0' || !std::isfinite(parsed) || parsed <= 0 || parsed > 86400) {
      errors.push_back(
          SpecError{fmt::format("engine.args[{}]", i), 0,
                    fmt::format("--drain-timeout '{}' is not seconds in (0, 86400]", *value)});
      continue;
    }
    seconds = parsed;
  }
  return seconds;
}

Json http_probe(const char* path, int period, int failures, int timeout) {
  return Json{{"httpGet", {{"path", path}, {"port", "http"}}},
              {"periodSeconds", period},
              {"timeoutSeconds", timeout},
              {"failureThreshold", failures}};
}

// Non-root, no privilege escalation, no capabilities, read-only root: the
// server writes nothing but /tmp.
Json container_security() {
  return Json{{"runAsNonRoot", true},           {"runAsUser", kImageUserId},
              {"runAsGroup", kImageUserId},     {"allowPrivilegeEscalation", false},
              {"readOnlyRootFilesystem", true}, {"capabilities", {{"drop", Json::array({"ALL"})}}}};
}

Json pod_security() {
  return Json{{"runAsNonRoot", true},
              {"runAsUser", kImageUserId},
              {"runAsGroup", kImageUserId},
              {"fsGroup", kImageUserId},
              {"seccompProfile", {{"type", "RuntimeDefault"}}}};
}

// Replicas spread over zones where they can be, but are still scheduled
// when a zone is full (a replica elsewhere beats none).
Json zone_spread(const DeploymentSpec& spec, const char* component) {
  return Json::array({Json{{"maxSkew", 1},
                           {"topologyKey", "topology.kubernetes.io/zone"},
                           {"whenUnsatisfiable", "ScheduleAnyway"},
                           {"labelSelector", {{"matchLabels", labels(spec, component)}}}}});
}

// Pods only on nodes of the spec's regions (when it names any).
void add_region_affinity(const DeploymentSpec& spec, Json& pod_spec) {
  if (spec.regions.empty()) return;
  Json values = Json::array();
  for (const std::string& region : spec.regions) values.push_back(region);
  pod_spec["affinity"]["nodeAffinity"] = {
      {"requiredDuringSchedulingIgnoredDuringExecution",
       {{"nodeSelectorTerms",
         Json::array({{{"matchExpressions", Json::array({{{"key", "topology.kubernetes.io/region"},
                                                           {"operator", "In"},
                                                           {"values", values}}})}}})}}}};
}

// A group's pods (leader and workers) in one zone: each requires a pod of
// its own group (matchLabelKeys adds the pod's group key to the selector;
// Kubernetes 1.29+, on by default from 1.31) in its zone. The group's first
// pod matches itself, so it goes wherever its resources are, and the others
// follow it: their collectives then stay off the links between zones.
void add_group_zone_affinity(const DeploymentSpec& spec, Json& pod_spec) {
  pod_spec["affinity"]["podAffinity"] = {
      {"requiredDuringSchedulingIgnoredDuringExecution",
       Json::array({{{"labelSelector", {{"matchLabels", labels(spec, "engine")}}},
                     {"matchLabelKeys", Json::array({kGroupKeyLabel})},
                     {"topologyKey", "topology.kubernetes.io/zone"}}})}};
}

Json pre_stop_sleep() {
  return Json{
      {"preStop",
       {{"exec", {{"command", Json::array({"sleep", std::to_string(kPreStopSleepSeconds)})}}}}}};
}

Json deployment(const DeploymentSpec& spec, const RenderOptions& options, const std::string& name,
                const char* component, std::optional<int> replicas, Json pod_spec) {
  Json spec_body = Json::object();
  // Left out when an autoscaler owns the count, so re-applying the
  // manifests does not reset it.
  if (replicas) spec_body["replicas"] = *replicas;
  spec_body["selector"] = {{"matchLabels", labels(spec, component)}};
  // Capacity never drops during a rollout: a new pod is ready before an
  // old one goes.
  spec_body["strategy"] = {{"type", "RollingUpdate"},
                           {"rollingUpdate", {{"maxSurge", 1}, {"maxUnavailable", 0}}}};
  Json template_metadata = {{"labels", labels(spec, component)}};
  if (pod_spec.contains("annotations")) {
    template_metadata["annotations"] = pod_spec["annotations"];
    pod_spec.erase("annotations");
  }
  spec_body["template"] = {{"metadata", template_metadata}, {"spec", pod_spec}};
  return Json{{"apiVersion", "apps/v1"},
              {"kind", "Deployment"},
              {"metadata", metadata(spec, options, name, component)},
              {"spec", spec_body}};
}

Json engine_pod(const DeploymentSpec& spec, double drain, EngineRole role) {
  const DeploymentSpec::Resources& res = spec.resources;
  const std::string nodes_port = std::to_string(kNodeLinkPort);
  Json args = role == EngineRole::kWorker
                  ? Json::array({"serve"})
                  : Json::array({"serve", "--host", "0.0.0.0", "--port", std::to_string(spec.engine.port)});
  args.push_back("--model");
  args.push_back(spec.model.path);
  for (const std::string& arg : spec.engine.args) args.push_back(arg);
  // Over several nodes: node 0 listens for the others, which find it at the
  // address LeaderWorkerSet gives every pod of the group (Kubernetes
  // expands $(VAR) in args from the container's environment).
  if (role != EngineRole::kAlone) {
    args.push_back("--nnodes");
    args.push_back(std::to_string(res.nodes));
    args.push_back("--node-rank");
    args.push_back(role == EngineRole::kLeader ? "0" : "$(LWS_WORKER_INDEX)");
    args.push_back("--dist-init-addr");
    args.push_back(role == EngineRole::kLeader ? "0.0.0.0:" + nodes_port : "$(LWS_LEADER_ADDRESS):" + nodes_port);
  }
  // No CPU limit: throttling a decode step costs latency; the request
  // reserves the cores. Memory is limited at its request so the pod is
  // not the one evicted first under pressure.
  Json requests = {{"cpu", res.cpu}, {"memory", res.memory}};
  Json limits = {{"memory", res.memory}};
  if (res.gpu_count > 0) {
    requests[kGpuResource] = std::to_string(res.gpu_count);
    limits[kGpuResource] = std::to_string(res.gpu_count);
  }
  Json mounts = Json::array({{{"name", "tmp"}, {"mountPath", "/tmp"}}});
  Json volumes = Json::array({{{"name", "tmp"}, {"emptyDir", Json::object()}}});
  if (!spec.model.pvc.empty()) {
    mounts.push_back({{"name", "models"}, {"mountPath", "/models"}, {"readOnly", true}});
    volumes.push_back(
        {{"name", "models"},
         {"persistentVolumeClaim", {{"claimName", spec.model.pvc}, {"readOnly", true}}}});
  }
  Json container = {{"name", "engine"}, {"image", spec.image}, {"command", Json::array({"basalt"})}, {"args", args}};
  if (role == EngineRole::kWorker) {
    // A worker serves no HTTP (its leader does) and has nothing to probe:
    // it ends when its leader stops, and a failed one makes LeaderWorkerSet
    // recreate the whole group. It outlives SIGTERM until its leader has
    // drained (the same grace as the leader's).
    container["resources"] = {{"requests", requests}, {"limits", limits}};
  } else {
    Json ports = Json::array({{{"name", "http"}, {"containerPort", spec.engine.port}, {"protocol", "TCP"}}});
    if (role == EngineRole::kLeader)
      ports.push_back({{"name", "nodes"}, {"containerPort", kNodeLinkPort}, {"protocol", "TCP"}});
    container["ports"] = ports;
    container["resources"] = {{"requests", requests}, {"limits", limits}};
    container["startupProbe"] =
        http_probe("/ready", kStartupProbePeriodSeconds,
                   static_cast<int>(std::ceil(spec.engine.startup_timeout_s / kStartupProbePeriodSeconds)), 1);
    container["readinessProbe"] = http_probe("/ready", kProbePeriodSeconds, 2, 2);
    container["livenessProbe"] = http_probe("/health", 10, 3, 5);
    container["lifecycle"] = pre_stop_sleep();
  }
  container["securityContext"] = container_security();
  container["volumeMounts"] = mounts;
  Json pod = Json::object();
  // Where a Prometheus that follows these annotations scrapes the replica;
  // the autoscaler's queries read what it collects.
  if (role != EngineRole::kWorker)
    pod["annotations"] = {{"prometheus.io/scrape", "true"},
                          {"prometheus.io/port", std::to_string(spec.engine.port)},
                          {"prometheus.io/path", "/metrics"}};
  pod["terminationGracePeriodSeconds"] = static_cast<int>(std::ceil(drain)) + kGraceBeyondDrainSeconds;
  pod["automountServiceAccountToken"] = false;
  pod["enableServiceLinks"] = false;
  pod["securityContext"] = pod_security();
  pod["containers"] = Json::array({container});
  pod["volumes"] = volumes;
  // Replicas (their leaders) spread over zones; a group's workers go where
  // the scheduler finds their GPUs in their leader's zone.
  if (role != EngineRole::kWorker) {
    pod["topologySpreadConstraints"] = zone_spread(spec, "engine");
    if (role == EngineRole::kLeader)
      pod["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"][kWorkerIndexLabel] = "0";
  }
  if (res.gpu_count > 0) {
    if (!res.gpu_product.empty()) pod["nodeSelector"] = {{kGpuProductLabel, res.gpu_product}};
    // GPU node pools are commonly tainted so that only GPU pods land there.
    pod["tolerations"] =
        Json::array({{{"key", kGpuResource}, {"operator", "Exists"}, {"effect", "NoSchedule"}}});
  }
  add_region_affinity(spec, pod);
  if (role != EngineRole::kAlone) add_group_zone_affinity(spec, pod);
  return pod;
}

Json engine_deployment(const DeploymentSpec& spec, const RenderOptions& options, double drain,
                       std::optional<int> replicas) {
  return deployment(spec, options, engine_name(spec), "engine", replicas, engine_pod(spec, drain, EngineRole::kAlone));
}

// A pod template of a LeaderWorkerSet from an engine pod (its annotations
// moved to the template's metadata, as deployment() does).
Json pod_template(const DeploymentSpec& spec, Json pod) {
  Json metadata = {{"labels", labels(spec, "engine")}};
  if (pod.contains("annotations")) {
    metadata["annotations"] = pod["annotations"];
    pod.erase("annotations");
  }
  return Json{{"metadata", metadata}, {"spec", pod}};
}

// A replica over resources.nodes nodes: a LeaderWorkerSet whose groups are
// a leader (node 0: the server, what the Service lists) and nodes - 1
// workers, created, replaced and scaled together (docs/DEPLOY.md step 5).
Json engine_group(const DeploymentSpec& spec, const RenderOptions& options, double drain, bool autoscaled) {
  Json body = Json::object();
  if (!autoscaled) body["replicas"] = spec.replicas.min;  // left out when an autoscaler owns it
  // Workers start with their leader, which waits for them to join: with
  // LeaderReady they would wait for a leader that is ready only once they
  // have joined.
  body["startupPolicy"] = "LeaderCreated";
  // As the Deployment's: capacity never drops during a rollout.
  body["rolloutStrategy"] = {{"type", "RollingUpdate"},
                             {"rollingUpdateConfiguration", {{"maxUnavailable", 0}, {"maxSurge", 1}}}};
  body["leaderWorkerTemplate"] = {
      {"size", spec.resources.nodes},
      // A lost node breaks the group's collectives: the group starts over.
      {"restartPolicy", "RecreateGroupOnPodRestart"},
      {"leaderTemplate", pod_template(spec, engine_pod(spec, drain, EngineRole::kLeader))},
      {"workerTemplate", pod_template(spec, engine_pod(spec, drain, EngineRole::kWorker))}};
  return Json{{"apiVersion", kLwsApiVersion},
              {"kind", "LeaderWorkerSet"},
              {"metadata", metadata(spec, options, group_name(spec), "engine")},
              {"spec", body}};
}

// What the autoscalers scale: the Deployment, or the LeaderWorkerSet (it
// has a scale subresource) whose replicas are groups.
Json scale_target(const DeploymentSpec& spec) {
  if (spans_nodes(spec))
    return Json{{"apiVersion", kLwsApiVersion}, {"kind", "LeaderWorkerSet"}, {"name", group_name(spec)}};
  return Json{{"apiVersion", "apps/v1"}, {"kind", "Deployment"}, {"name", engine_name(spec)}};
}

// Headless: its DNS name resolves to every ready replica's address (over
// several nodes, its leader's).
Json engine_service(const DeploymentSpec& spec, const RenderOptions& options) {
  Json selector = labels(spec, "engine");
  if (spans_nodes(spec)) selector[kWorkerIndexLabel] = "0";
  return Json{{"apiVersion", "v1"},
              {"kind", "Service"},
              {"metadata", metadata(spec, options, engine_name(spec), "engine")},
              {"spec",
               {{"clusterIP", "None"},
                {"selector", selector},
                {"ports", Json::array({{{"name", "http"},
                                        {"port", spec.engine.port},
                                        {"targetPort", "http"},
                                        {"protocol", "TCP"}}})}}}};
}

Json disruption_budget(const DeploymentSpec& spec, const RenderOptions& options,
                       const std::string& name, const char* component) {
  return Json{
      {"apiVersion", "policy/v1"},
      {"kind", "PodDisruptionBudget"},
      {"metadata", metadata(spec, options, name, component)},
      {"spec", {{"maxUnavailable", 1}, {"selector", {{"matchLabels", labels(spec, component)}}}}}};
}

// A number as a flag or YAML text takes it (0.5, 8).
std::string number_text(double value) { return fmt::format("{}", value); }

Json gateway_deployment(const DeploymentSpec& spec, const RenderOptions& options) {
  // The headless Service's name resolves to each ready replica.
  const std::string engine_dns =
      fmt::format("{}.{}.svc:{}", engine_name(spec), options.namespace_name, spec.engine.port);
  Json args = Json::array({"route", "--host", "0.0.0.0", "--port", std::to_string(kGatewayPort),
                           "--replica-dns", engine_dns});
  Json mounts = Json::array({{{"name", "tmp"}, {"mountPath", "/tmp"}}});
  Json volumes = Json::array({{{"name", "tmp"}, {"emptyDir", Json::object()}}});
  if (!spec.tenants_secret.empty()) {
    args.push_back("--tenants-file");
    args.push_back(std::string(kTenantsDir) + "/" + kTenantsKey);
    mounts.push_back({{"name", "tenants"}, {"mountPath", kTenantsDir}, {"readOnly", true}});
    // Naming the key makes a Secret without it fail the pod's start
    // instead of starting a gateway without its tenants.
    volumes.push_back(
        {{"name", "tenants"},
         {"secret",
          {{"secretName", spec.tenants_secret},
           {"items", Json::array({{{"key", kTenantsKey}, {"path", kTenantsKey}}})}}}});
  }
  // The gateways' autoscaler (docs/DEPLOY.md section 4), whose count KEDA or
  // the HPA reads; it also makes them hold requests while no replica is ready.
  if (spec.replicas.max > spec.replicas.min) {
    const DeploymentSpec::Autoscaling& a = spec.autoscaling;
    args.push_back("--autoscale");
    args.push_back(fmt::format("metric={} target={} min={} max={} up_after={}s down_after={}s", a.metric,
                               number_text(a.target), spec.replicas.min, spec.replicas.max,
                               static_cast<int>(std::ceil(a.up_after_s)),
                               static_cast<int>(std::ceil(a.down_after_s))));
  }
  // The gateway's /ready needs a ready replica; a pool that scales to zero
  // keeps its gateways in the Service (they queue requests meanwhile), so
  // there readiness is /health.
  const char* readiness = spec.replicas.min == 0 ? "/health" : "/ready";
  Json container = {
      {"name", "gateway"},
      {"image", spec.image},
      {"command", Json::array({"basalt"})},
      {"args", args},
      {"ports",
       Json::array({{{"name", "http"}, {"containerPort", kGatewayPort}, {"protocol", "TCP"}}})},
      {"resources", {{"requests", {{"cpu", "500m"}, {"memory", "512Mi"}}}}},
      {"readinessProbe", http_probe(readiness, kProbePeriodSeconds, 2, 2)},
      {"livenessProbe", http_probe("/health", 10, 3, 5)},
      {"lifecycle", pre_stop_sleep()},
      {"securityContext", container_security()},
      {"volumeMounts", mounts}};
  Json pod = {// Its basalt_route_desired_replicas is what the autoscaler reads.
              {"annotations",
               {{"prometheus.io/scrape", "true"},
                {"prometheus.io/port", std::to_string(kGatewayPort)},
                {"prometheus.io/path", "/metrics"}}},
              {"terminationGracePeriodSeconds",
               static_cast<int>(kDefaultDrainSeconds) + kGraceBeyondDrainSeconds},
              {"automountServiceAccountToken", false},
              {"enableServiceLinks", false},
              {"securityContext", pod_security()},
              {"containers", Json::array({container})},
              {"volumes", volumes},
              {"topologySpreadConstraints", zone_spread(spec, "gateway")}};
  add_region_affinity(spec, pod);
  return deployment(spec, options, gateway_name(spec), "gateway", spec.gateway.replicas,
                    std::move(pod));
}

Json gateway_service(const DeploymentSpec& spec, const RenderOptions& options) {
  return Json{{"apiVersion", "v1"},
              {"kind", "Service"},
              {"metadata", metadata(spec, options, gateway_name(spec), "gateway")},
              {"spec",
               {{"type", "ClusterIP"},
                {"selector", labels(spec, "gateway")},
                {"ports", Json::array({{{"name", "http"},
                                        {"port", kGatewayPort},
                                        {"targetPort", "http"},
                                        {"protocol", "TCP"}}})}}}};
}

// What the autoscaler reads (docs/DEPLOY.md section 4): the replica count
// the gateways' own autoscaler wants for the pool, the largest of theirs
// (each sees every replica but only its own queue). As an AverageValue
// against 1 per replica, the HPA's count is that number. No `or vector(0)`:
// with no gateway series the scaler errs and keeps the count, where a 0
// would empty the pool.
std::string desired_replicas_query(const DeploymentSpec& spec, const RenderOptions& options) {
  return fmt::format("max(basalt_route_desired_replicas{{namespace=\"{}\",pod=~\"{}-.+\"}})",
                     options.namespace_name, gateway_name(spec));
}

// The name a Prometheus adapter serves that query under for the HPA (docs/DEPLOY.md).
const char* const kDesiredReplicasMetric = "basalt_route_desired_replicas";

// The HPA behavior both autoscalers use. The gateway's count has waited
// up_after and down_after already, so no stabilization window holds it
// again; replicas are added at most doubling each 15 s and removed one per
// down_after (at most 30 minutes, the HPA's limit on a policy's period).
Json scaling_behavior(const DeploymentSpec& spec) {
  const DeploymentSpec::Autoscaling& a = spec.autoscaling;
  return Json{
      {"scaleUp",
       {{"stabilizationWindowSeconds", 0},
        {"policies", Json::array({{{"type", "Percent"}, {"value", 100}, {"periodSeconds", 15}}})}}},
      {"scaleDown",
       {{"stabilizationWindowSeconds", 0},
        {"policies", Json::array({{{"type", "Pods"},
                                   {"value", 1},
                                   {"periodSeconds",
                                    std::min(kMaxPolicyPeriodSeconds,
                                             static_cast<int>(std::ceil(a.down_after_s)))}}})}}}};
}

// KEDA waits this long after the gateways' count reaches 0 before taking
// the last replica away: the count itself has waited down_after.
constexpr int kKedaCooldownSeconds = 30;

Json keda_scaled_object(const DeploymentSpec& spec, const RenderOptions& options) {
  return Json{
      {"apiVersion", "keda.sh/v1alpha1"},
      {"kind", "ScaledObject"},
      {"metadata", metadata(spec, options, engine_name(spec), "engine")},
      {"spec",
       {{"scaleTargetRef", scale_target(spec)},
        {"pollingInterval", 15},
        // Used by KEDA only for the last step, from one replica to zero.
        {"cooldownPeriod", kKedaCooldownSeconds},
        {"minReplicaCount", spec.replicas.min},
        {"maxReplicaCount", spec.replicas.max},
        {"advanced", {{"horizontalPodAutoscalerConfig", {{"behavior", scaling_behavior(spec)}}}}},
        {"triggers", Json::array({{{"type", "prometheus"},
                                   {"metricType", "AverageValue"},
                                   {"metadata",
                                    {{"serverAddress", spec.autoscaling.prometheus},
                                     {"query", desired_replicas_query(spec, options)},
                                     {"threshold", "1"},
                                     // From zero, the first request waiting in a gateway
                                     // makes its count 1, which wakes the pool.
                                     {"activationThreshold", "0"},
                                     // No gateway series: an error (the count is kept), not 0.
                                     {"ignoreNullValues", "false"}}}}})}}}};
}

Json hpa(const DeploymentSpec& spec, const RenderOptions& options) {
  return Json{{"apiVersion", "autoscaling/v2"},
              {"kind", "HorizontalPodAutoscaler"},
              {"metadata", metadata(spec, options, engine_name(spec), "engine")},
              {"spec",
               {{"scaleTargetRef", scale_target(spec)},
                {"minReplicas", spec.replicas.min},
                {"maxReplicas", spec.replicas.max},
                {"metrics", Json::array({{{"type", "External"},
                                          {"external",
                                           {{"metric",
                                             {{"name", kDesiredReplicasMetric},
                                              {"selector",
                                               {{"matchLabels",
                                                 {{"namespace", options.namespace_name},
                                                  {"deployment", engine_name(spec)}}}}}}},
                                            {"target", {{"type", "AverageValue"}, {"averageValue", "1"}}}}}}})},
                {"behavior", scaling_behavior(spec)}}}};
}

bool is_dns_label(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(s.front()) || !alnum(s.back())) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return alnum(c) || c == '-'; });
}

std::vector<SpecError> unrenderable(const DeploymentSpec& spec, const RenderOptions& options) {
  std::vector<SpecError> errors;
  if (!is_dns_label(options.namespace_name))
    errors.push_back(
        SpecError{"--namespace", 0,
                  fmt::format("'{}' is not a lowercase DNS label of at most 63 characters",
                              options.namespace_name)});
  const bool autoscaled = spec.replicas.max > spec.replicas.min;
  // Any metric may scale to zero: the gateways hold the first requests and
  // count 1 for them (docs/DEPLOY.md section 4).
  if (autoscaled && spec.replicas.min == 0 && options.autoscaler == Autoscaler::kHpa)
    errors.push_back(SpecError{
        "replicas.min", 0,
        "0 (scale to zero) needs --autoscaler keda: the HPA keeps at least one replica"});
  return errors;
}

// Whether a plain scalar with this text would be read back as something
// other than a string (a number, a boolean, null) by YAML 1.1 or 1.2
// readers: Kubernetes' reader is YAML 1.1's, where `yes` and `on` are booleans.
bool needs_quotes(const std::string& s) {
  if (s.empty()) return true;
  std::string lower = s;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  for (const char* word : {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "~"})
    if (lower == word) return true;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  if (*end == '\0') return true;  // 8000, 0.5, 1e3, 0x1F, inf
  if (lower.size() > 2 && lower[0] == '0' && (lower[1] == 'b' || lower[1] == 'o')) return true;
  if (lower.size() > 1 && lower[0] == '.' &&
      (lower == ".inf" || lower == ".nan" || lower == "-.inf"))
    return true;
  // YAML 1.1's base-60 integers (1:30).
  return std::isdigit(static_cast<unsigned char>(s[0])) && s.find(':') != std::string::npos &&
         s.find_first_not_of("0123456789:._") == std::string::npos;
}

void emit(YAML::Emitter& out, const Json& value) {
  switch (value.type()) {
    case Json::value_t::object:
      if (value.empty()) {
        out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
        return;
      }
      out << YAML::BeginMap;
      for (const auto& [key, item] : value.items()) {
        out << YAML::Key;
        if (needs_quotes(key))
          out << YAML::DoubleQuoted << key;
        else
          out << key;
        out << YAML::Value;
        emit(out, item);
      }
      out << YAML::EndMap;
      return;
    case Json::value_t::array:
      if (value.empty()) {
        out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
        return;
      }
      out << YAML::BeginSeq;
      for (const Json& item : value) emit(out, item);
      out << YAML::EndSeq;
      return;
    case Json::value_t::string: {
      const std::string& s = value.get_ref<const std::string&>();
      if (needs_quotes(s))
        out << YAML::DoubleQuoted << s;
      else
        out << s;
      return;
    }
    case Json::value_t::boolean:
      out << (value.get<bool>() ? "true" : "false");
      return;
    case Json::value_t::number_integer:
      out << value.get<long long>();
      return;
    case Json::value_t::number_unsigned:
      out << value.get<unsigned long long>();
      return;
    case Json::value_t::number_float:
      out << fmt::format("{}", value.get<double>());
      return;
    default:
      out << YAML::Null;
      return;
  }
}

}  // namespace

RenderResult render_manifests(const DeploymentSpec& spec, const RenderOptions& options) {
  RenderResult result;
  result.errors = unrenderable(spec, options);
  const double drain = drain_seconds(spec, result.errors);
  if (!result.errors.empty()) return result;
  const bool autoscaled = spec.replicas.max > spec.replicas.min;
  if (spans_nodes(spec))
    result.objects.push_back(engine_group(spec, options, drain, autoscaled));
  else
    result.objects.push_back(engine_deployment(
        spec, options, drain, autoscaled ? std::nullopt : std::optional<int>(spec.replicas.min)));
  result.objects.push_back(engine_service(spec, options));
  result.objects.push_back(disruption_budget(spec, options, engine_name(spec), "engine"));
  result.objects.push_back(gateway_deployment(spec, options));
  result.objects.push_back(gateway_service(spec, options));
  result.objects.push_back(disruption_budget(spec, options, gateway_name(spec), "gateway"));
  if (autoscaled)
    result.objects.push_back(options.autoscaler == Autoscaler::kKeda
                                 ? keda_scaled_object(spec, options)
                                 : hpa(spec, options));
  return result;
}

std::string to_yaml(const nlohmann::ordered_json& object) {
  YAML::Emitter out;
  out.SetIndent(2);
  emit(out, object);
  return std::string(out.c_str()) + "\n";
}

std::string manifest_file_name(const nlohmann::ordered_json& object) {
  std::string kind = object.at("kind").get<std::string>();
  std::transform(kind.begin(), kind.end(), kind.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return kind + "-" + object.at("metadata").at("name").get<std::string>() + ".yaml";
}

}  // namespace basalt::deploy

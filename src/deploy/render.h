// render_manifests: the Kubernetes objects one DeploymentSpec becomes
// (docs/DEPLOY.md section 2), built as JSON trees, and their YAML text.
//
// Contract:
//  * render_manifests(spec, options) takes a spec without errors (from
//    parse_deployment_spec) and returns, in this order: the engine
//    Deployment `NAME-engine` (with resources.nodes > 1 the
//    LeaderWorkerSet `NAME-group` instead, below), its headless Service
//    `NAME-engine` (over several nodes, of the leaders), its
//    PodDisruptionBudget `NAME-engine` (maxUnavailable 1), the gateway
//    Deployment `NAME-gateway`, its Service `NAME-gateway`, its
//    PodDisruptionBudget `NAME-gateway`, and, when replicas.max >
//    replicas.min, the autoscaler `NAME-engine`: a KEDA ScaledObject
//    (keda.sh/v1alpha1, Prometheus trigger) or an autoscaling/v2
//    HorizontalPodAutoscaler on an external metric, both reading the
//    gateways' basalt_route_desired_replicas (the largest) as an
//    AverageValue against 1 per replica, without stabilization windows
//    (the gateways' count has its hysteresis). Every object is in
//    options.namespace and carries the labels app.kubernetes.io/name
//    (basalt), instance (NAME) and component (engine, gateway).
//  * What the spec cannot be rendered to is returned as errors (each with
//    the field path it is about, line 0) and no objects: a --drain-timeout
//    in engine.args that is not a number of seconds in
//    (0, 86400], replicas.min 0 with the HPA (its minReplicas is at least
//    1), and a namespace that is not a DNS label.
//  * The engine pods run `basalt serve --host 0.0.0.0 --port P --model
//    PATH ARGS` as user 10001 (the images' `basalt`) with a read-only root
//    file system and a writable /tmp; their termination grace is the
//    drain timeout + 15 s, which covers the 5 s preStop sleep (the pod
//    leaves the Service's endpoints before SIGTERM starts the drain) and
//    leaves 10 s to exit. Probes: startup and readiness on /ready, liveness
//    on /health.
//  * resources.nodes N > 1: a leaderworkerset.x-k8s.io/v1 LeaderWorkerSet
//    whose groups (replicas) are N pods: the leader (the engine pod above,
//    plus `--nnodes N --node-rank 0 --dist-init-addr 0.0.0.0:29500` and the
//    port `nodes`) and N - 1 workers (`basalt serve --model PATH ARGS
//    --nnodes N --node-rank $(LWS_WORKER_INDEX) --dist-init-addr
//    $(LWS_LEADER_ADDRESS):29500`: no HTTP port, probes or preStop, the
//    same resources and grace), startupPolicy LeaderCreated, restartPolicy
//    RecreateGroupOnPodRestart, rolling updates that surge a group; the
//    autoscalers scale it, and the Service selects worker index 0.
//  * The gateway runs `basalt route --replica-dns NAME-engine.NS.svc:PORT`:
//    every ready replica, as the headless Service's DNS name lists them,
//    with the tenants file from the Secret when one is named, and when
//    autoscaled `--autoscale 'metric=M target=T min=N max=N up_after=Us
//    down_after=Ds'` from the spec (its autoscaler; docs/DEPLOY.md section 4).
//  * to_yaml(object) writes one YAML document (no `---`); strings that a
//    YAML reader would take for a number, a boolean or null are quoted, so
//    the text reads back as the same tree.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "deploy/spec.h"

namespace basalt::deploy {

enum class Autoscaler { kKeda, kHpa };

struct RenderOptions {
  std::string namespace_name = "default";
  Autoscaler autoscaler = Autoscaler::kKeda;
};

struct RenderResult {
  std::vector<nlohmann::ordered_json> objects;
  std::vector<SpecError> errors;
};

RenderResult render_manifests(const DeploymentSpec& spec, const RenderOptions& options);

std::string to_yaml(const nlohmann::ordered_json& object);

// "deployment-mini-engine.yaml": the file --out writes an object to.
std::string manifest_file_name(const nlohmann::ordered_json& object);

// The user and group the images run as (deploy/Dockerfile.*).
constexpr int kImageUserId = 10001;
// Seconds between SIGTERM's arrival and the end of the preStop sleep, and
// the margin after the drain for the process to exit.
constexpr int kPreStopSleepSeconds = 5;
constexpr int kGraceBeyondDrainSeconds = 15;
// The gateway's container port and its Service's port.
constexpr int kGatewayPort = 8000;
// Where a replica's leader listens for its other nodes (--dist-init-addr).
constexpr int kNodeLinkPort = 29500;

}  // namespace basalt::deploy

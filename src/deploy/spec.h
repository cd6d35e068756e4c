// DeploymentSpec: one deployment of a model, as `basalt.yaml` describes it
// (docs/DEPLOY.md section 1; a commented example is deploy/basalt.yaml).
//
// Contract:
//  * parse_deployment_spec(text) parses YAML text into a DeploymentSpec,
//    filling defaults, and returns every problem it finds, not just the
//    first: each SpecError names the field's path (`replicas.max`,
//    `engine.args[2]`), the 1-based line of the value (0 when the field is
//    missing) and what is wrong, in file order (missing fields last). The
//    spec is usable only when `errors` is empty. Unknown keys are errors (a misspelled key must not
//    be ignored), and so are values of the wrong type. Malformed YAML is one error at the line the
//    YAML parser reports; so is a file over 1 MiB or with lists or mappings nested more than 64
//    deep (the parser recurses per level). Nothing throws for bad input.
//  * Required: name (a DNS-1123 label of at most 50 characters, so that
//    the names derived from it stay within Kubernetes' 63), image, and
//    model.path (absolute). Everything else has the default shown in
//    DeploymentSpec.
//  * engine.args are `basalt serve` flags passed verbatim; the ones the
//    rendered manifests set themselves (--host, --port, --model) are refused.
//  * Quantities (resources.cpu, resources.memory) follow Kubernetes'
//    syntax (`4`, `500m`, `16Gi`, `1.5G`); durations (autoscaling.up_after,
//    down_after, engine.startup_timeout) are a number with s, m or h (`30s`,
//    `5m`), above 0 and at most a day.
//  * autoscaling.prometheus is an http:// or https:// URL without
//    whitespace, quotes or backslashes (it is written into a query's
//    manifest verbatim).
#pragma once

#include <string>
#include <vector>

namespace basalt::deploy {

struct DeploymentSpec {
  std::string name;
  std::string image;
  struct Model {
    std::string path;  // inside the image, or under /models when `pvc` is set
    std::string pvc;   // a PersistentVolumeClaim mounted read-only at /models; empty: none
  } model;
  struct Engine {
    std::vector<std::string> args;
    int port = 8000;
    // How long a replica may take from start to /ready before the kubelet
    // restarts it (the startup probe's budget). A start reads the weights
    // (on a cold node, from the image layer or the volume at its read rate)
    // and copies them to the GPU: `basalt bench --cold-start` measures it
    // (docs/DEPLOY.md section 5); ten minutes covers an 8B model read at
    // 100 MB/s three times over.
    double startup_timeout_s = 600;
  } engine;
  struct Resources {
    std::string cpu = "2";
    std::string memory = "8Gi";
    int gpu_count = 0;        // nvidia.com/gpu per pod
    std::string gpu_product;  // nvidia.com/gpu.product node label value; empty: any
    int nodes = 1;            // > 1: one replica spans nodes (a leader and workers)
  } resources;
  struct Replicas {
    int min = 1;  // 0: scale to zero
    int max = 1;
  } replicas;
  struct Autoscaling {
    std::string metric = "concurrency";  // concurrency | queue_time | ttft_p95
    double target = 8;                   // requests per replica, or seconds
    double up_after_s = 30;
    double down_after_s = 300;
    // The Prometheus server the autoscaler's queries go to (KEDA's trigger;
    // the HPA reads them through an adapter). The default is the Service
    // the Prometheus operator creates in kube-prometheus' `monitoring`.
    std::string prometheus = "http://prometheus-operated.monitoring.svc:9090";
  } autoscaling;
  std::vector<std::string> regions;  // topology.kubernetes.io/region values; empty: anywhere
  std::string tenants_secret;        // the gateway's tenants file, from this Secret; empty: none
  struct Gateway {
    int replicas = 2;
  } gateway;
};

struct SpecError {
  std::string path;
  int line = 0;
  std::string message;
};

struct SpecResult {
  DeploymentSpec spec;
  std::vector<SpecError> errors;
};

SpecResult parse_deployment_spec(const std::string& yaml_text);

// "line 17: replicas.max: 0 is below replicas.min (1)" (no line part when
// the line is 0).
std::string describe(const SpecError& error);

}  // namespace basalt::deploy

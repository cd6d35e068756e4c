#include "deploy/spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fmt/format.h>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <set>

namespace basalt::deploy {
namespace {

// Kubernetes' name and quantity syntaxes, by hand (std::regex trips GCC 12's
// -Wmaybe-uninitialized in the sanitizer build, and these are small).
bool alnum_lower(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool alnum(char c) { return alnum_lower(c) || (c >= 'A' && c <= 'Z'); }

// A DNS-1123 label: [a-z0-9] and '-', starting and ending with [a-z0-9].
bool is_label(std::string_view s) {
  if (s.empty() || !alnum_lower(s.front()) || !alnum_lower(s.back())) return false;
  for (char c : s)
    if (!alnum_lower(c) && c != '-') return false;
  return true;
}
// A DNS-1123 subdomain: labels joined by '.'.
bool is_subdomain(std::string_view s) {
  while (true) {
    const size_t dot = s.find('.');
    if (!is_label(s.substr(0, dot))) return false;
    if (dot == std::string_view::npos) return true;
    s.remove_prefix(dot + 1);
  }
}
// A label value: [A-Za-z0-9], '-', '_' and '.', starting and ending alphanumeric.
bool is_label_value(std::string_view s) {
  if (s.empty() || !alnum(s.front()) || !alnum(s.back())) return false;
  for (char c : s)
    if (!alnum(c) && c != '-' && c != '_' && c != '.') return false;
  return true;
}
// The length of a leading decimal number (digits, optionally '.' and digits); 0 if none.
size_t decimal_length(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  if (i == 0) return 0;
  if (i < s.size() && s[i] == '.') {
    size_t j = i + 1;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    if (j == i + 1) return 0;
    i = j;
  }
  return i;
}
// A quantity: a decimal number followed by one of `suffixes` (or none).
bool is_quantity(std::string_view s, std::initializer_list<std::string_view> suffixes) {
  const size_t n = decimal_length(s);
  if (n == 0) return false;
  const std::string_view suffix = s.substr(n);
  if (suffix.empty()) return true;
  for (std::string_view ok : suffixes)
    if (suffix == ok) return true;
  return false;
}
bool is_cpu(std::string_view s) { return is_quantity(s, {"m"}); }
bool is_memory(std::string_view s) { return is_quantity(s, {"k", "M", "G", "T", "P", "Ki", "Mi", "Gi", "Ti", "Pi"}); }

constexpr size_t kMaxNameLength = 50;  // leaves room for "-gateway-pdb" and the like within 63

// Reads one document, recording what is wrong instead of stopping there.
class Reader {
 public:
  explicit Reader(std::vector<SpecError>& errors) : errors_(errors) {}

  void error(const std::string& path, const YAML::Node& node, std::string message) {
    const int line = node.IsDefined() && node.Mark().line >= 0 ? node.Mark().line + 1 : 0;
    errors_.push_back(SpecError{path, line, std::move(message)});
  }

  // Whether `node` is a mapping whose keys are all in `keys` (unknown keys
  // are reported, and the mapping is still read).
  bool mapping(const YAML::Node& node, const std::string& path, std::initializer_list<const char*> keys) {
    if (!node.IsMap()) {
      error(path, node, "expected a mapping");
      return false;
    }
    for (const auto& entry : node) {
      const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : std::string();
      bool known = false;
      for (const char* k : keys) known = known || key == k;
      if (!known) {
        std::string list;
        for (const char* k : keys) list += (list.empty() ? "" : ", ") + std::string(k);
        error(join(path, key.empty() ? "?" : key), entry.first, fmt::format("unknown key (expected one of: {})", list));
      }
    }
    return true;
  }

  std::optional<std::string> scalar(const YAML::Node& node, const std::string& path) {
    if (!node.IsScalar()) {
      error(path, node, "expected a single value");
      return std::nullopt;
    }
    return node.Scalar();
  }

  // An optional field's value: none when absent or null, or when it is not
  // a single value (reported).
  std::optional<std::string> present(const YAML::Node& node, const std::string& path) {
    if (!node.IsDefined() || node.IsNull()) return std::nullopt;
    return scalar(node, path);
  }

  // A string field; `required` reports a missing one.
  void text(const YAML::Node& parent, const char* key, const std::string& path, std::string& out, bool required) {
    const YAML::Node node = parent[key];
    if (!node.IsDefined() || node.IsNull()) {
      if (required) errors_.push_back(SpecError{path, 0, "required"});
      return;
    }
    const auto v = scalar(node, path);
    if (!v) return;
    // `name: ""` or a bare tag (`name: !`) is a value that says nothing.
    if (required && v->empty()) {
      error(path, node, "required, and empty here");
      return;
    }
    out = *v;
  }

  void integer(const YAML::Node& parent, const char* key, const std::string& path, int& out, int lo, int hi) {
    const YAML::Node node = parent[key];
    const auto v = present(node, path);
    if (!v) return;
    try {
      const long long n = std::stoll(*v);
      if (std::to_string(n) != *v) throw std::invalid_argument("not canonical");
      if (n < lo || n > hi) {
        error(path, node, fmt::format("{} is outside [{}, {}]", *v, lo, hi));
        return;
      }
      out = static_cast<int>(n);
    } catch (const std::exception&) {
      error(path, node, fmt::format("'{}' is not an integer", *v));
    }
  }

  void positive_number(const YAML::Node& parent, const char* key, const std::string& path, double& out) {
    const YAML::Node node = parent[key];
    const auto v = present(node, path);
    if (!v) return;
    try {
      size_t used = 0;
      const double d = std::stod(*v, &used);
      if (used != v->size() || !std::isfinite(d)) throw std::invalid_argument("not a number");
      if (d <= 0) {
        error(path, node, fmt::format("{} must be above 0", *v));
        return;
      }
      out = d;
    } catch (const std::exception&) {
      error(path, node, fmt::format("'{}' is not a number", *v));
    }
  }

  void duration(const YAML::Node& parent, const char* key, const std::string& path, double& seconds) {
    const YAML::Node node = parent[key];
    const auto v = present(node, path);
    if (!v) return;
    const size_t n = decimal_length(*v);
    const std::string unit_text = v->substr(n);
    if (n == 0 || (unit_text != "s" && unit_text != "m" && unit_text != "h")) {
      error(path, node, fmt::format("'{}' is not a duration (a number with s, m or h: 30s, 5m)", *v));
      return;
    }
    const double unit = unit_text == "s" ? 1 : unit_text == "m" ? 60 : 3600;
    const double s = std::stod(v->substr(0, n)) * unit;
    if (s <= 0 || s > 86400) {
      error(path, node, fmt::format("'{}' must be above 0 and at most a day", *v));
      return;
    }
    seconds = s;
  }

  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

 private:
  std::vector<SpecError>& errors_;
};

void check_name(Reader& r, const YAML::Node& node, const std::string& path, const std::string& value,
                bool (*shape)(std::string_view), size_t max_length, const char* what) {
  if (value.empty()) return;
  if (value.size() > max_length || !shape(value))
    r.error(path, node, fmt::format("'{}' is not {}, at most {} characters", value, what, max_length));
}

bool has_whitespace(const std::string& s) { return s.find_first_of(" \t\r\n") != std::string::npos; }

void read_model(Reader& r, const YAML::Node& root, DeploymentSpec& spec) {
  const YAML::Node node = root["model"];
  if (!node.IsDefined() || node.IsNull()) {
    r.error("model.path", node, "required");
    return;
  }
  if (!r.mapping(node, "model", {"path", "volume"})) return;
  r.text(node, "path", "model.path", spec.model.path, true);
  const bool path_ok = !spec.model.path.empty() && spec.model.path[0] == '/' &&
                       spec.model.path.find("/../") == std::string::npos && !has_whitespace(spec.model.path);
  if (!spec.model.path.empty() && !path_ok)
    r.error("model.path", node["path"],
            fmt::format("'{}' must be an absolute path without '..' or whitespace", spec.model.path));
  const YAML::Node volume = node["volume"];
  if (volume.IsDefined() && !volume.IsNull() && r.mapping(volume, "model.volume", {"pvc"})) {
    r.text(volume, "pvc", "model.volume.pvc", spec.model.pvc, true);
    check_name(r, volume["pvc"], "model.volume.pvc", spec.model.pvc, is_subdomain, 253,
               "a PersistentVolumeClaim name (lowercase DNS subdomain)");
    if (!spec.model.pvc.empty() && path_ok && spec.model.path.rfind("/models/", 0) != 0)
      r.error("model.path", node["path"], "with model.volume the model lies under /models/ (where the volume is mounted)");
  }
}

void read_engine(Reader& r, const YAML::Node& root, DeploymentSpec& spec) {
  const YAML::Node node = root["engine"];
  if (!node.IsDefined() || node.IsNull() || !r.mapping(node, "engine", {"args", "port", "startup_timeout"})) return;
  r.integer(node, "port", "engine.port", spec.engine.port, 1, 65535);
  r.duration(node, "startup_timeout", "engine.startup_timeout", spec.engine.startup_timeout_s);
  const YAML::Node args = node["args"];
  if (!args.IsDefined() || args.IsNull()) return;
  if (!args.IsSequence()) {
    r.error("engine.args", args, "expected a list of `basalt serve` flags");
    return;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string path = fmt::format("engine.args[{}]", i);
    const auto v = r.scalar(args[i], path);
    if (!v) continue;
    const std::pair<const char*, const char*> set_by_render[] = {
        {"--host", "engine.port"},       {"--port", "engine.port"},        {"--model", "model.path"},
        {"--nnodes", "resources.nodes"}, {"--node-rank", "resources.nodes"}, {"--dist-init-addr", "resources.nodes"}};
    for (const auto& [own, field] : set_by_render)
      if (*v == own || v->rfind(std::string(own) + "=", 0) == 0)
        r.error(path, args[i], fmt::format("{} is set by the rendered manifests ({})", own, field));
    spec.engine.args.push_back(*v);
  }
}

void read_resources(Reader& r, const YAML::Node& root, DeploymentSpec& spec) {
  const YAML::Node node = root["resources"];
  if (!node.IsDefined() || node.IsNull() || !r.mapping(node, "resources", {"cpu", "memory", "gpu", "nodes"})) return;
  DeploymentSpec::Resources& res = spec.resources;
  r.text(node, "cpu", "resources.cpu", res.cpu, false);
  if (!is_cpu(res.cpu) || std::stod(res.cpu) <= 0)
    r.error("resources.cpu", node["cpu"], fmt::format("'{}' is not a CPU quantity above 0 (4, 500m)", res.cpu));
  r.text(node, "memory", "resources.memory", res.memory, false);
  if (!is_memory(res.memory) || std::stod(res.memory) <= 0)
    r.error("resources.memory", node["memory"],
            fmt::format("'{}' is not a memory quantity above 0 (16Gi, 512Mi, 8G)", res.memory));
  const YAML::Node gpu = node["gpu"];
  bool count_given = false;  // a count was written, valid or not (no second error about it)
  if (gpu.IsDefined() && !gpu.IsNull() && r.mapping(gpu, "resources.gpu", {"count", "product"})) {
    count_given = gpu["count"].IsDefined();
    r.integer(gpu, "count", "resources.gpu.count", res.gpu_count, 0, 16);
    r.text(gpu, "product", "resources.gpu.product", res.gpu_product, false);
    check_name(r, gpu["product"], "resources.gpu.product", res.gpu_product, is_label_value, 63,
               "a node label value (as nvidia.com/gpu.product has them: NVIDIA-H200)");
    if (!res.gpu_product.empty() && res.gpu_count == 0 && !count_given)
      r.error("resources.gpu.product", gpu["product"], "a GPU product without resources.gpu.count");
  }
  r.integer(node, "nodes", "resources.nodes", res.nodes, 1, 64);
  if (res.nodes > 1 && res.gpu_count == 0 && !count_given)
    r.error("resources.nodes", node["nodes"], "a replica spans nodes only with GPUs (resources.gpu.count)");
}

// The --tp of engine.args (--tp N, --tp=N, --tensor-parallel-size N), 0
// when none is given, -1 when its value is not a number.
int tensor_parallel_size(const std::vector<std::string>& args) {
  int tp = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string value;
    for (const std::string flag : {"--tp", "--tensor-parallel-size"}) {
      if (args[i] == flag && i + 1 < args.size()) value = args[i + 1];
      else if (args[i].rfind(flag + "=", 0) == 0) value = args[i].substr(flag.size() + 1);
    }
    if (value.empty()) continue;
    tp = value.size() <= 3 && value.find_first_not_of("0123456789") == std::string::npos ? std::stoi(value) : -1;
  }
  return tp;
}

// A replica over several nodes runs every GPU of its pods as a rank
// (`basalt serve --nnodes`, docs/SERVER.md): engine.args gives --tp
// gpu.count x nodes, and no --dp-attention (which runs within one machine).
void check_nodes(Reader& r, const YAML::Node& root, const DeploymentSpec& spec) {
  const DeploymentSpec::Resources& res = spec.resources;
  const YAML::Node engine = root["engine"];
  const YAML::Node args = engine.IsDefined() && engine.IsMap() ? engine["args"] : engine;
  if (res.nodes <= 1 || res.gpu_count == 0 || (args.IsDefined() && !args.IsNull() && !args.IsSequence())) return;
  const int gpus = res.gpu_count * res.nodes, tp = tensor_parallel_size(spec.engine.args);
  if (tp != gpus)
    r.error("engine.args", args,
            fmt::format("a replica over {} nodes of {} GPUs runs its {} GPUs as ranks: give --tp {} ({})", res.nodes,
                        res.gpu_count, gpus, gpus, tp == 0 ? std::string("no --tp given") : fmt::format("--tp is {}", tp)));
  if (std::find(spec.engine.args.begin(), spec.engine.args.end(), "--dp-attention") != spec.engine.args.end())
    r.error("engine.args", args,
            "--dp-attention runs over the GPUs of one node; a replica over several nodes runs --tp alone");
}

void read_scaling(Reader& r, const YAML::Node& root, DeploymentSpec& spec) {
  const YAML::Node replicas = root["replicas"];
  if (replicas.IsDefined() && !replicas.IsNull() && r.mapping(replicas, "replicas", {"min", "max"})) {
    r.integer(replicas, "min", "replicas.min", spec.replicas.min, 0, 1000);
    // max defaults to min (at least 1): a fixed size unless asked.
    spec.replicas.max = std::max(spec.replicas.min, 1);
    r.integer(replicas, "max", "replicas.max", spec.replicas.max, 1, 1000);
    if (spec.replicas.max < spec.replicas.min)
      r.error("replicas.max", replicas["max"],
              fmt::format("{} is below replicas.min ({})", spec.replicas.max, spec.replicas.min));
  }
  const YAML::Node node = root["autoscaling"];
  if (!node.IsDefined() || node.IsNull() ||
      !r.mapping(node, "autoscaling", {"metric", "target", "up_after", "down_after", "prometheus"}))
    return;
  DeploymentSpec::Autoscaling& a = spec.autoscaling;
  r.text(node, "metric", "autoscaling.metric", a.metric, false);
  const bool seconds = a.metric == "queue_time" || a.metric == "ttft_p95";
  if (a.metric != "concurrency" && !seconds)
    r.error("autoscaling.metric", node["metric"],
            fmt::format("'{}' is not concurrency, queue_time or ttft_p95", a.metric));
  if (seconds && !node["target"].IsDefined())
    r.error("autoscaling.target", node, fmt::format("required with metric {} (seconds)", a.metric));
  r.positive_number(node, "target", "autoscaling.target", a.target);
  r.duration(node, "up_after", "autoscaling.up_after", a.up_after_s);
  r.duration(node, "down_after", "autoscaling.down_after", a.down_after_s);
  r.text(node, "prometheus", "autoscaling.prometheus", a.prometheus, false);
  const bool scheme_ok =
      a.prometheus.rfind("http://", 0) == 0 || a.prometheus.rfind("https://", 0) == 0;
  const size_t scheme_end = a.prometheus.find("://") + 3;
  if (!scheme_ok || a.prometheus.size() == scheme_end || a.prometheus.size() > 2048 ||
      a.prometheus.find_first_of(" \t\r\n\"'\\") != std::string::npos)
    r.error("autoscaling.prometheus", node["prometheus"],
            fmt::format("'{}' is not an http:// or https:// URL (without whitespace or quotes)",
                        a.prometheus));
}

void read_placement(Reader& r, const YAML::Node& root, DeploymentSpec& spec) {
  const YAML::Node regions = root["regions"];
  if (regions.IsDefined() && !regions.IsNull()) {
    if (!regions.IsSequence()) {
      r.error("regions", regions, "expected a list of region names");
    } else {
      std::set<std::string> seen;
      for (size_t i = 0; i < regions.size(); ++i) {
        const std::string path = fmt::format("regions[{}]", i);
        const auto v = r.scalar(regions[i], path);
        if (!v) continue;
        if (!is_label_value(*v) || v->size() > 63)
          r.error(path, regions[i], fmt::format("'{}' is not a region label value", *v));
        else if (!seen.insert(*v).second)
          r.error(path, regions[i], fmt::format("'{}' is listed twice", *v));
        else
          spec.regions.push_back(*v);
      }
    }
  }
  const YAML::Node tenants = root["tenants"];
  if (tenants.IsDefined() && !tenants.IsNull() && r.mapping(tenants, "tenants", {"secret"})) {
    r.text(tenants, "secret", "tenants.secret", spec.tenants_secret, true);
    check_name(r, tenants["secret"], "tenants.secret", spec.tenants_secret, is_subdomain, 253,
               "a Secret name (lowercase DNS subdomain)");
  }
  const YAML::Node gateway = root["gateway"];
  if (gateway.IsDefined() && !gateway.IsNull() && r.mapping(gateway, "gateway", {"replicas"}))
    r.integer(gateway, "replicas", "gateway.replicas", spec.gateway.replicas, 1, 100);
}

constexpr size_t kMaxSpecBytes = 1 << 20;
constexpr int kMaxFlowDepth = 64;

// The deepest nesting of flow collections ([...], {...}) outside quotes and
// comments. The YAML parser recurses once per level; a spec needs a few.
int flow_depth(const std::string& text) {
  int depth = 0, deepest = 0;
  char quote = 0;
  bool comment = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (comment) {
      comment = c != '\n';
    } else if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t' || text[i - 1] == '\n')) {
      comment = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

SpecResult parse_deployment_spec(const std::string& yaml_text) {
  SpecResult result;
  if (yaml_text.size() > kMaxSpecBytes) {
    result.errors.push_back(SpecError{"", 0, fmt::format("the file has {} bytes; a spec has at most {}",
                                                          yaml_text.size(), kMaxSpecBytes)});
    return result;
  }
  if (flow_depth(yaml_text) > kMaxFlowDepth) {
    result.errors.push_back(SpecError{"", 0, fmt::format("lists or mappings nested more than {} deep", kMaxFlowDepth)});
    return result;
  }
  Reader r(result.errors);
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    result.errors.push_back(SpecError{"", e.mark.line >= 0 ? e.mark.line + 1 : 0, "not valid YAML: " + e.msg});
    return result;
  }
  if (!root.IsMap()) {
    result.errors.push_back(SpecError{"", 0, "the file must hold one mapping (name:, image:, model:, ...)"});
    return result;
  }
  DeploymentSpec& spec = result.spec;
  r.mapping(root, "",
            {"name", "image", "model", "engine", "resources", "replicas", "autoscaling", "regions", "tenants",
             "gateway"});
  r.text(root, "name", "name", spec.name, true);
  check_name(r, root["name"], "name", spec.name, is_label, kMaxNameLength,
             "a lowercase DNS label (letters, digits and '-', starting and ending with a letter or digit)");
  r.text(root, "image", "image", spec.image, true);
  if (has_whitespace(spec.image)) r.error("image", root["image"], fmt::format("'{}' holds whitespace", spec.image));
  read_model(r, root, spec);
  read_engine(r, root, spec);
  read_resources(r, root, spec);
  check_nodes(r, root, spec);
  read_scaling(r, root, spec);
  read_placement(r, root, spec);
  // In file order; what has no line (missing fields) last.
  std::stable_sort(result.errors.begin(), result.errors.end(), [](const SpecError& a, const SpecError& b) {
    return (a.line > 0 ? a.line : INT32_MAX) < (b.line > 0 ? b.line : INT32_MAX);
  });
  return result;
}

std::string describe(const SpecError& error) {
  const std::string where = error.path.empty() ? "" : error.path + ": ";
  return error.line > 0 ? fmt::format("line {}: {}{}", error.line, where, error.message) : where + error.message;
}

}  // namespace basalt::deploy

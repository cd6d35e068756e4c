#include "router/tenants.h"

#include <algorithm>
#include <cmath>
#include <cctype>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "router/placement.h"
#include "server/http_auth.h"

namespace basalt::router {
namespace {

using json = nlohmann::json;

// Checks that `object` (at `path`) has only `allowed` fields.
void only(const json& object, std::initializer_list<const char*> allowed, std::string_view file,
          const std::string& path) {
  BASALT_CHECK(object.is_object(), "{}: {} must be an object", file, path);
  for (const auto& [key, value] : object.items()) {
    const bool known = std::any_of(allowed.begin(), allowed.end(), [&](const char* a) { return key == a; });
    BASALT_CHECK(known, "{}: {}.{} is not a known field", file, path, key);
  }
}

double positive_number(const json& v, std::string_view file, const std::string& path) {
  BASALT_CHECK(v.is_number() && v.get<double>() > 0 && std::isfinite(v.get<double>()),
               "{}: {} must be a positive number", file, path);
  return v.get<double>();
}

int64_t milliseconds(const json& v, std::string_view file, const std::string& path) {
  BASALT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= 3600000,
               "{}: {} must be an integer number of milliseconds in [1, 3600000]", file, path);
  return v.get<int64_t>();
}

// A list of distinct region or pool names at `path`; `non_empty` when it may not be [].
std::vector<std::string> names(const json& v, bool non_empty, std::string_view file, const std::string& path) {
  BASALT_CHECK(v.is_array() && (!non_empty || !v.empty()) && v.size() <= 64,
               "{}: {} must be a list of {}at most 64 names", file, path, non_empty ? "1 to " : "");
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", path, i);
    BASALT_CHECK(v[i].is_string() && valid_placement_name(v[i].get<std::string>()),
                 "{}: {} must be a name of 1-64 letters, digits, '-', '_' or '.'", file, at);
    BASALT_CHECK(std::find(out.begin(), out.end(), v[i].get<std::string>()) == out.end(),
                 "{}: {} is given twice in the list", file, at);
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

}  // namespace

std::vector<Tenant> parse_tenants(std::string_view text, std::string_view name) {
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  BASALT_CHECK(!doc.is_discarded(), "{}: not JSON", name);
  only(doc, {"classes", "tenants"}, name, "the file");
  // The classes, as the tenants of each get them.
  std::map<std::string, Tenant> classes;
  classes["default"].class_name = "default";
  if (const auto c = doc.find("classes"); c != doc.end()) {
    BASALT_CHECK(c->is_object(), "{}: classes must be an object", name);
    for (const auto& [class_name, spec] : c->items()) {
      const std::string path = "classes." + class_name;
      only(spec, {"priority", "queue_deadline_ms", "ttft_slo_ms", "sheddable"}, name, path);
      Tenant& k = classes[class_name];
      k.class_name = class_name;
      if (const auto p = spec.find("priority"); p != spec.end()) {
        BASALT_CHECK(p->is_number_integer() && p->get<int64_t>() >= -100 && p->get<int64_t>() <= 100,
                     "{}: {}.priority must be an integer in [-100, 100]", name, path);
        k.priority = p->get<int>();
      }
      if (spec.contains("queue_deadline_ms"))
        k.queue_deadline_ms = milliseconds(spec["queue_deadline_ms"], name, path + ".queue_deadline_ms");
      if (spec.contains("ttft_slo_ms")) k.ttft_slo_ms = milliseconds(spec["ttft_slo_ms"], name, path + ".ttft_slo_ms");
      if (const auto sh = spec.find("sheddable"); sh != spec.end()) {
        BASALT_CHECK(sh->is_boolean(), "{}: {}.sheddable must be true or false", name, path);
        k.sheddable = sh->get<bool>();
      }
    }
  }
  BASALT_CHECK(doc.contains("tenants") && doc["tenants"].is_object() && !doc["tenants"].empty(),
               "{}: `tenants` must be an object with at least one tenant", name);
  std::vector<Tenant> out;
  std::set<std::string> keys;
  for (const auto& [tenant_name, spec] : doc["tenants"].items()) {
    const std::string path = "tenants." + tenant_name;
    BASALT_CHECK(!tenant_name.empty() && tenant_name.size() <= 64 &&
                     std::all_of(tenant_name.begin(), tenant_name.end(),
                                 [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.'; }),
                 "{}: tenant names are 1-64 letters, digits, '-', '_' or '.' ({})", name, path);
    only(spec, {"keys", "class", "weight", "limits", "share_cache", "regions", "pool", "overflow_pools"}, name,
         path);
    std::string class_name = "default";
    if (const auto c = spec.find("class"); c != spec.end()) {
      BASALT_CHECK(c->is_string() && classes.count(c->get<std::string>()),
                   "{}: {}.class must name a class of `classes`", name, path);
      class_name = c->get<std::string>();
    }
    Tenant t = classes.at(class_name);
    t.name = tenant_name;
    const auto k = spec.find("keys");
    BASALT_CHECK(k != spec.end() && k->is_array() && !k->empty(), "{}: {}.keys must be a list of API keys", name,
                 path);
    for (const json& key : *k) {
      BASALT_CHECK(key.is_string() && !key.get<std::string>().empty() && key.get<std::string>().size() <= 256,
                   "{}: {}.keys holds something that is not a key (1-256 characters)", name, path);
      BASALT_CHECK(keys.insert(key.get<std::string>()).second, "{}: {}.keys: a key is given twice in the file", name,
                   path);
      t.keys.push_back(key.get<std::string>());
    }
    if (spec.contains("weight")) {
      t.weight = positive_number(spec["weight"], name, path + ".weight");
      BASALT_CHECK(t.weight <= 1e6, "{}: {}.weight must be at most 1000000", name, path);
    }
    if (const auto l = spec.find("limits"); l != spec.end()) {
      only(*l, {"rps", "burst", "tokens_per_min", "max_concurrency", "max_queued"}, name, path + ".limits");
      if (l->contains("tokens_per_min"))
        t.limits.tokens_per_min = positive_number((*l)["tokens_per_min"], name, path + ".limits.tokens_per_min");
      if (l->contains("max_queued")) {
        const json& m = (*l)["max_queued"];
        BASALT_CHECK(m.is_number_integer() && m.get<int64_t>() > 0 && m.get<int64_t>() <= 1000000,
                     "{}: {}.limits.max_queued must be an integer in [1, 1000000]", name, path);
        t.limits.max_queued = m.get<int64_t>();
      }
      if (l->contains("rps")) t.limits.rps = positive_number((*l)["rps"], name, path + ".limits.rps");
      if (l->contains("burst")) {
        BASALT_CHECK(l->contains("rps"), "{}: {}.limits.burst needs rps", name, path);
        t.limits.burst = positive_number((*l)["burst"], name, path + ".limits.burst");
      }
      if (t.limits.rps > 0 && t.limits.burst == 0) t.limits.burst = std::max(1.0, t.limits.rps);
      if (l->contains("max_concurrency")) {
        const json& m = (*l)["max_concurrency"];
        BASALT_CHECK(m.is_number_integer() && m.get<int64_t>() > 0, "{}: {}.limits.max_concurrency must be a "
                     "positive integer", name, path);
        t.limits.max_concurrency = m.get<int64_t>();
      }
    }
    if (const auto s = spec.find("share_cache"); s != spec.end()) {
      BASALT_CHECK(s->is_boolean(), "{}: {}.share_cache must be true or false", name, path);
      t.share_cache = s->get<bool>();
    }
    if (const auto r = spec.find("regions"); r != spec.end()) t.regions = names(*r, true, name, path + ".regions");
    if (const auto p = spec.find("pool"); p != spec.end()) {
      BASALT_CHECK(p->is_string() && valid_placement_name(p->get<std::string>()),
                   "{}: {}.pool must be a name of 1-64 letters, digits, '-', '_' or '.'", name, path);
      t.pool = p->get<std::string>();
    }
    if (const auto o = spec.find("overflow_pools"); o != spec.end()) {
      t.overflow_pools = names(*o, false, name, path + ".overflow_pools");
      const auto home = std::find(t.overflow_pools.begin(), t.overflow_pools.end(), t.pool);
      BASALT_CHECK(home == t.overflow_pools.end(), "{}: {}.overflow_pools[{}] is the tenant's own pool", name, path,
                   home - t.overflow_pools.begin());
    }
    out.push_back(std::move(t));
  }
  return out;
}

void TenantBook::set(std::vector<Tenant> tenants) {
  std::lock_guard<std::mutex> lock(mu_);
  tenants_ = std::move(tenants);
  for (const Tenant& t : tenants_) counters_.try_emplace(t.name);
}

bool TenantBook::empty() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tenants_.empty();
}

std::optional<Tenant> TenantBook::find(std::string_view key) const {
  std::lock_guard<std::mutex> lock(mu_);
  // Every key is compared, each in constant time: how long this takes
  // says nothing about which key came close.
  const Tenant* found = nullptr;
  for (const Tenant& t : tenants_)
    for (const std::string& k : t.keys)
      if (constant_time_equal(key, k) && found == nullptr) found = &t;
  if (found == nullptr) return std::nullopt;
  return *found;
}

TenantBook::Admission TenantBook::admit(const std::string& tenant, Clock::time_point now, int64_t tokens,
                                       bool queued) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto t = std::find_if(tenants_.begin(), tenants_.end(), [&](const Tenant& x) { return x.name == tenant; });
  if (t == tenants_.end()) {  // removed by a reload meanwhile: no limits left
    if (!queued) ++counters_[tenant].running;
    return {true, {}, 0};
  }
  Counters& c = counters_[tenant];
  const TenantLimits& l = t->limits;
  if (!queued && l.max_concurrency > 0 && c.running >= l.max_concurrency) return {false, "concurrency", 1};
  // Both buckets are brought up to date first; neither is charged unless both pass.
  if (l.rps > 0) {
    c.tokens = c.tokens < 0 ? l.burst
                            : std::min(l.burst, c.tokens + std::chrono::duration<double>(now - c.refilled).count() * l.rps);
    c.refilled = now;
  }
  const double per_s = l.tokens_per_min / 60;
  if (l.tokens_per_min > 0) {
    const double elapsed_s = std::chrono::duration<double>(now - c.token_refilled).count();
    c.token_bucket = !c.token_bucket ? l.tokens_per_min : std::min(l.tokens_per_min, *c.token_bucket + elapsed_s * per_s);
    c.token_refilled = now;
  }
  if (l.rps > 0 && c.tokens < 1) {
    const int wait = static_cast<int>(std::ceil((1 - c.tokens) / l.rps));
    return {false, "rate", std::clamp(wait, 1, 60)};
  }
  const double charge = static_cast<double>(std::max<int64_t>(0, tokens));
  if (l.tokens_per_min > 0 && *c.token_bucket < charge && *c.token_bucket < l.tokens_per_min) {
    const double deficit = std::min(charge, l.tokens_per_min) - *c.token_bucket;
    const double wait = std::ceil(deficit / per_s);
    return {false, "tokens", static_cast<int>(std::clamp(wait, 1.0, 60.0))};
  }
  if (l.rps > 0) c.tokens -= 1;
  if (l.tokens_per_min > 0) *c.token_bucket -= charge;
  if (!queued) ++c.running;
  return {true, {}, 0};
}

void TenantBook::started(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_[tenant].running;
}

void TenantBook::refund(const std::string& tenant, int64_t tokens) {
  if (tokens <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  const auto t = std::find_if(tenants_.begin(), tenants_.end(), [&](const Tenant& x) { return x.name == tenant; });
  const auto c = counters_.find(tenant);
  if (t == tenants_.end() || c == counters_.end() || t->limits.tokens_per_min <= 0 || !c->second.token_bucket) return;
  c->second.token_bucket = std::min(t->limits.tokens_per_min, *c->second.token_bucket + static_cast<double>(tokens));
}

void TenantBook::release(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = counters_.find(tenant);
  if (it != counters_.end() && it->second.running > 0) --it->second.running;
}

std::string TenantBook::cache_salt(const Tenant& tenant, std::string_view client_salt) {
  std::string salt = "t:" + tenant.name;
  if (!client_salt.empty()) salt += "/" + std::string(client_salt);
  return salt;
}

std::map<std::string, int64_t> TenantBook::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, int64_t> out;
  for (const Tenant& t : tenants_) out[t.name] = counters_.at(t.name).running;
  return out;
}

}  // namespace basalt::router

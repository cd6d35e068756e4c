#include "sim/step_table.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace basalt::sim {

using nlohmann::json;

double StepTable::decode_step_ms(int64_t batch) const {
  if (batch <= 0) return 0;
  const double b = static_cast<double>(batch);
  const auto& p = decode_ms;
  if (b <= p.front().first) return p.front().second;
  for (size_t i = 1; i < p.size(); ++i) {
    if (b <= p[i].first) {
      const double f = (b - p[i - 1].first) / (p[i].first - p[i - 1].first);
      return p[i - 1].second + f * (p[i].second - p[i - 1].second);
    }
  }
  if (p.size() == 1) return p.front().second * b / p.front().first;
  const auto& a = p[p.size() - 2];
  const auto& z = p.back();
  return z.second + (b - z.first) * (z.second - a.second) / (z.first - a.first);
}

double StepTable::step_ms(const Step& step) const {
  double ms = 0;
  if (step.decode_batch > 0) {
    const double extra = static_cast<double>(step.context_tokens) -
                         static_cast<double>(step.decode_batch) * decode_context_tokens;
    ms = std::max(decode_step_ms(step.decode_batch) + extra / 1000 * decode_ms_per_1k_context,
                  decode_ms.front().second);
  }
  if (step.prefill_tokens > 0)
    ms += prefill_fixed_ms + static_cast<double>(step.prefill_tokens) * 1000.0 / prefill_tokens_per_s +
          step.prefill_pairs / 1e6 * prefill_ms_per_1m_pairs;
  return ms;
}

double StepTable::chunk_pairs(int64_t before, int64_t chunk) {
  const double c = static_cast<double>(chunk);
  return c * (static_cast<double>(before) + (c + 1) / 2);
}

namespace {

const json& need(const json& j, const char* key, const std::string& label) {
  auto it = j.find(key);
  BASALT_CHECK(it != j.end(), "{}: no \"{}\"", label, key);
  return *it;
}

double positive_number(const json& v, const char* key, const std::string& label, bool zero_ok = false) {
  BASALT_CHECK(v.is_number(), "{}: \"{}\" must be a number", label, key);
  const double x = v.get<double>();
  BASALT_CHECK(std::isfinite(x) && (zero_ok ? x >= 0 : x > 0), "{}: \"{}\" must be {} 0, got {}", label, key,
               zero_ok ? ">=" : ">", x);
  return x;
}

int64_t count_at_least_one(const json& v, const char* key, const std::string& label) {
  BASALT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1, "{}: \"{}\" must be an integer >= 1, got {}", label,
               key, v.dump());
  return v.get<int64_t>();
}

}  // namespace

StepTable parse_step_table(const std::string& text, const std::string& label) {
  const json j = json::parse(text, nullptr, false);
  BASALT_CHECK(!j.is_discarded(), "{}: not JSON", label);
  BASALT_CHECK(j.is_object(), "{}: not a JSON object", label);
  static const std::set<std::string> known = {"name",
                                              "source",
                                              "decode_ms",
                                              "prefill_tokens_per_s",
                                              "prefill_fixed_ms",
                                              "prefill_ms_per_1m_pairs",
                                              "decode_context_tokens",
                                              "decode_ms_per_1k_context",
                                              "max_running",
                                              "step_token_budget",
                                              "kv_capacity_tokens",
                                              "gpus_per_replica"};
  for (const auto& [key, value] : j.items())
    BASALT_CHECK(known.count(key) == 1, "{}: unknown key \"{}\"", label, key);
  StepTable t;
  const json& name = need(j, "name", label);
  BASALT_CHECK(name.is_string(), "{}: \"name\" must be a string", label);
  t.name = name.get<std::string>();
  const json& source = need(j, "source", label);
  BASALT_CHECK(source.is_string(), "{}: \"source\" must be a string", label);
  t.source = source.get<std::string>();
  const json& decode = need(j, "decode_ms", label);
  BASALT_CHECK(decode.is_array() && !decode.empty(), "{}: \"decode_ms\" must be a non-empty array of [batch, ms]",
               label);
  for (size_t i = 0; i < decode.size(); ++i) {
    const json& p = decode[i];
    BASALT_CHECK(p.is_array() && p.size() == 2 && p[0].is_number() && p[1].is_number(),
                 "{}: decode_ms[{}] must be [batch, ms]", label, i);
    const double batch = p[0].get<double>(), ms = p[1].get<double>();
    BASALT_CHECK(std::isfinite(batch) && batch >= 1, "{}: decode_ms[{}]: batch must be >= 1, got {}", label, i,
                 batch);
    BASALT_CHECK(std::isfinite(ms) && ms > 0, "{}: decode_ms[{}]: ms must be > 0, got {}", label, i, ms);
    BASALT_CHECK(t.decode_ms.empty() || batch > t.decode_ms.back().first,
                 "{}: decode_ms[{}]: batches must increase, {} after {}", label, i, batch,
                 t.decode_ms.empty() ? 0 : t.decode_ms.back().first);
    t.decode_ms.emplace_back(batch, ms);
  }
  t.prefill_tokens_per_s = positive_number(need(j, "prefill_tokens_per_s", label), "prefill_tokens_per_s", label);
  if (j.contains("prefill_fixed_ms"))
    t.prefill_fixed_ms = positive_number(j["prefill_fixed_ms"], "prefill_fixed_ms", label, true);
  if (j.contains("prefill_ms_per_1m_pairs"))
    t.prefill_ms_per_1m_pairs = positive_number(j["prefill_ms_per_1m_pairs"], "prefill_ms_per_1m_pairs", label, true);
  if (j.contains("decode_context_tokens"))
    t.decode_context_tokens = positive_number(j["decode_context_tokens"], "decode_context_tokens", label, true);
  if (j.contains("decode_ms_per_1k_context"))
    t.decode_ms_per_1k_context =
        positive_number(j["decode_ms_per_1k_context"], "decode_ms_per_1k_context", label, true);
  t.max_running = count_at_least_one(need(j, "max_running", label), "max_running", label);
  t.step_token_budget = count_at_least_one(need(j, "step_token_budget", label), "step_token_budget", label);
  t.kv_capacity_tokens = count_at_least_one(need(j, "kv_capacity_tokens", label), "kv_capacity_tokens", label);
  if (j.contains("gpus_per_replica"))
    t.gpus_per_replica = count_at_least_one(j["gpus_per_replica"], "gpus_per_replica", label);
  return t;
}

StepTable load_step_table(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  BASALT_CHECK(in.good(), "--step-table {}: cannot read it", path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_step_table(text, path);
}

}  // namespace basalt::sim

#include "loadgen/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

namespace basalt::loadgen {

using nlohmann::json;

json request_details_json(const std::vector<RequestDetail>& details) {
  json out = json::array();
  for (const RequestDetail& d : details)
    out.push_back({{"index", d.index},
                   {"turn", d.turn},
                   {"scheduled_s", d.scheduled_s},
                   {"ttft_ms", d.ttft_ms},
                   {"e2e_ms", d.e2e_ms},
                   {"input_tokens", d.input_tokens},
                   {"output_tokens", d.output_tokens},
                   {"error", d.error}});
  return out;
}

Metrics compute_metrics(const RunResult& run, const SloLimits& slo, double rate, bool detailed) {
  Metrics m;
  m.slo = slo;
  m.rate = rate > 0 && std::isfinite(rate) ? rate : 0;
  m.abandoned_turns = run.abandoned_turns;
  m.held_by_limit = run.held_by_limit;
  m.duration_s = run.wall_s;
  std::vector<RequestLatency> latencies;
  std::vector<double> lags, out_lens;
  std::set<std::string> examples;
  std::map<std::string, int> shown;  // examples kept per kind
  for (const RequestRecord& rec : run.records) {
    const ExchangeResult& r = rec.result;
    ++m.requests;
    if (rec.on_schedule) lags.push_back(rec.lag_s * 1000.0);
    RequestDetail* detail = nullptr;
    if (detailed) {
      detail = &m.details.emplace_back();
      detail->index = rec.conversation;
      detail->turn = rec.turn;
      detail->scheduled_s = rec.scheduled_s;
      detail->input_tokens = rec.input_tokens;
    }
    if (r.error != ErrorKind::kNone) {
      if (detail != nullptr) detail->error = std::string(error_kind_name(r.error)) + ": " + r.error_message;
      ++m.failed;
      ++m.errors[error_kind_name(r.error)];
      // Up to two distinct examples of each kind, so one common kind does not hide the others.
      const std::string kind = error_kind_name(r.error);
      if (shown[kind] < 2 && examples.insert(r.error_message).second) {
        ++shown[kind];
        m.error_examples.push_back(kind + ": " + r.error_message);
      }
      continue;
    }
    ++m.completed;
    const int64_t out = r.usage_completion_tokens >= 0 ? r.usage_completion_tokens : r.chunk_tokens;
    const int64_t in = r.usage_prompt_tokens >= 0 ? r.usage_prompt_tokens : rec.input_tokens;
    m.output_tokens += out;
    m.input_tokens += in;
    out_lens.push_back(static_cast<double>(out));
    const double e2e = (r.end_s - r.sent_s) * 1000.0;
    m.e2e_ms.push_back(e2e);
    RequestLatency lat;
    if (r.first_token_s >= 0) {
      lat.ttft_ms = (r.first_token_s - r.sent_s) * 1000.0;
      m.ttft_ms.push_back(lat.ttft_ms);
      lat.tpot_ms = time_per_output_token_ms(e2e, lat.ttft_ms, out);
      if (out > 1) m.tpot_ms.push_back(lat.tpot_ms);
    } else {
      lat.ttft_ms = e2e;  // no token at all: the first "token" is the end
    }
    for (size_t i = 1; i < r.token_times.size(); ++i) m.itl_ms.push_back((r.token_times[i] - r.token_times[i - 1]) * 1000.0);
    latencies.push_back(lat);
    if (detail != nullptr) {
      detail->ttft_ms = r.first_token_s >= 0 ? lat.ttft_ms : -1;
      detail->e2e_ms = e2e;
      detail->input_tokens = in;
      detail->output_tokens = out;
    }
    // Throughput over time: each token in the 1-second bin it arrived in.
    for (double t : r.token_times) {
      const size_t bin = static_cast<size_t>(std::max(0.0, t));
      if (bin >= m.tokens_per_second.size()) m.tokens_per_second.resize(bin + 1, 0.0);
      m.tokens_per_second[bin] += 1;
    }
  }
  for (auto* v : {&m.ttft_ms, &m.itl_ms, &m.tpot_ms, &m.e2e_ms}) std::sort(v->begin(), v->end());
  std::sort(m.details.begin(), m.details.end(), [](const RequestDetail& a, const RequestDetail& b) {
    return std::pair(a.index, a.turn) < std::pair(b.index, b.turn);
  });
  m.ttft = summarize(m.ttft_ms);
  m.itl = summarize(m.itl_ms);
  m.tpot = summarize(m.tpot_ms);
  m.e2e = summarize(m.e2e_ms);
  m.output_len = summarize(out_lens);
  m.good = count_good(latencies, slo);
  if (m.duration_s > 0) {
    m.request_throughput = static_cast<double>(m.completed) / m.duration_s;
    m.output_throughput = static_cast<double>(m.output_tokens) / m.duration_s;
    m.total_token_throughput = static_cast<double>(m.output_tokens + m.input_tokens) / m.duration_s;
    m.goodput = static_cast<double>(m.good) / m.duration_s;
  }
  m.cpu_s = run.cpu_user_s + run.cpu_system_s;
  m.cpu_us_per_token = m.output_tokens > 0 ? m.cpu_s * 1e6 / static_cast<double>(m.output_tokens) : 0;
  m.cpu_fraction = m.duration_s > 0 ? m.cpu_s / m.duration_s : 0;
  m.lag_ms = summarize(lags);
  if (m.cpu_fraction >= 0.9 && m.duration_s >= 1) {  // shorter runs are dominated by start-up
    m.client_bottleneck = true;
    m.bottleneck_reasons.push_back(fmt::format("the client used {:.0f}% of one core", m.cpu_fraction * 100));
  }
  const double late_ms = m.rate > 0 ? std::max(1.0, 0.1 * 1000.0 / m.rate) : 10.0;
  if (m.lag_ms.p99 > late_ms) {
    m.client_bottleneck = true;
    m.bottleneck_reasons.push_back(
        m.rate > 0 ? fmt::format("requests went out late (P99 arrival lag {:.1f} ms, over a tenth of the {:.1f} ms "
                                 "mean gap between arrivals)",
                                 m.lag_ms.p99, 1000.0 / m.rate)
                   : fmt::format("requests went out late (P99 arrival lag {:.1f} ms)", m.lag_ms.p99));
  }
  return m;
}

namespace {

json summary_json(const Summary& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"median", s.median}, {"p90", s.p90},
          {"p95", s.p95},     {"p99", s.p99},   {"max", s.max},       {"min", s.min}};
}

}  // namespace

std::optional<SpecCounters> spec_counters(std::string_view text) {
  SpecCounters c;
  bool found = false;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
    if (line.empty() || line[0] == '#') continue;
    // name{labels} value [timestamp]
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, name_end);
    double* into = nullptr;
    if (name == "basalt_spec_draft_tokens_total" || name == "vllm:spec_decode_num_draft_tokens_total")
      into = &c.drafted;
    else if (name == "basalt_spec_accepted_tokens_total" || name == "vllm:spec_decode_num_accepted_tokens_total")
      into = &c.accepted;
    else if (name == "basalt_jump_forward_tokens_total")
      into = &c.jump_forward;
    if (into == nullptr) continue;
    size_t value_at = name_end;
    if (line[name_end] == '{') {
      const size_t close = line.find('}', name_end);
      if (close == std::string_view::npos) continue;
      value_at = close + 1;
    }
    const std::string value(line.substr(value_at));
    char* parsed_end = nullptr;
    const double v = std::strtod(value.c_str(), &parsed_end);
    if (parsed_end == value.c_str() || !std::isfinite(v)) continue;
    *into += v;
    found = true;
  }
  if (!found) return std::nullopt;
  return c;
}

json metrics_json(const Metrics& m) {
  json errors = {{"connect", 0}, {"http_status", 0}, {"timeout", 0}, {"stream", 0}};
  for (const auto& [k, v] : m.errors) errors[k] = v;
  json out = {{"label", m.label},
              {"request_rate", m.rate > 0 && std::isfinite(m.rate) ? json(m.rate) : json("inf")},
              {"max_concurrency", m.max_concurrency},
              {"requests", m.requests},
              {"completed", m.completed},
              {"failed", m.failed},
              {"abandoned_turns", m.abandoned_turns},
              {"duration_s", m.duration_s},
              {"input_tokens", m.input_tokens},
              {"output_tokens", m.output_tokens},
              {"request_throughput", m.request_throughput},
              {"output_token_throughput", m.output_throughput},
              {"total_token_throughput", m.total_token_throughput},
              {"slo", {{"ttft_ms", m.slo.ttft_ms}, {"tpot_ms", m.slo.tpot_ms}}},
              {"good_requests", m.good},
              {"goodput", m.goodput},
              {"ttft_ms", summary_json(m.ttft)},
              {"itl_ms", summary_json(m.itl)},
              {"tpot_ms", summary_json(m.tpot)},
              {"e2e_ms", summary_json(m.e2e)},
              {"output_len", summary_json(m.output_len)},
              {"errors", errors},
              {"error_examples", m.error_examples},
              {"tokens_per_second_timeline", m.tokens_per_second},
              {"speculative",
               m.speculation
                   ? json{{"draft_tokens", m.speculation->drafted},
                          {"accepted_tokens", m.speculation->accepted},
                          {"acceptance", m.speculation->drafted > 0 ? json(m.speculation->accepted /
                                                                           m.speculation->drafted)
                                                                    : json(nullptr)},
                          {"jump_forward_tokens", m.speculation->jump_forward}}
                   : json(nullptr)},
              {"client",
               {{"cpu_s", m.cpu_s},
                {"cpu_us_per_output_token", m.cpu_us_per_token},
                {"cpu_fraction_of_wall", m.cpu_fraction},
                {"arrival_lag_ms", summary_json(m.lag_ms)},
                {"held_by_concurrency_limit", m.held_by_limit},
                {"bottleneck", m.client_bottleneck},
                {"bottleneck_reasons", m.bottleneck_reasons}}}};
  if (!m.details.empty()) out["details"] = request_details_json(m.details);
  return out;
}

std::string metrics_table(const Metrics& m) {
  std::string s;
  const std::string rate = m.rate > 0 && std::isfinite(m.rate) ? fmt::format("{:g} req/s", m.rate) : "unlimited rate";
  const std::string conc = m.max_concurrency > 0 ? fmt::format(", max concurrency {}", m.max_concurrency) : "";
  s += fmt::format("==== {}{}{} ====\n", m.label.empty() ? "" : m.label + ": ", rate, conc);
  auto line = [&s](const std::string& k, const std::string& v) { s += fmt::format("{:<34}{:>14}\n", k, v); };
  line("Requests completed / sent", fmt::format("{} / {}", m.completed, m.requests));
  if (m.abandoned_turns > 0) line("Turns not sent (conversation failed)", fmt::format("{}", m.abandoned_turns));
  line("Duration (s)", fmt::format("{:.2f}", m.duration_s));
  line("Input tokens", fmt::format("{}", m.input_tokens));
  line("Output tokens", fmt::format("{}", m.output_tokens));
  line("Request throughput (req/s)", fmt::format("{:.2f}", m.request_throughput));
  line("Output token throughput (tok/s)", fmt::format("{:.1f}", m.output_throughput));
  line("Total token throughput (tok/s)", fmt::format("{:.1f}", m.total_token_throughput));
  if (m.slo.ttft_ms > 0 || m.slo.tpot_ms > 0) {
    line("Good requests (within SLOs)", fmt::format("{} / {}", m.good, m.completed));
    line("Goodput (req/s)", fmt::format("{:.2f}", m.goodput));
  }
  s += fmt::format("{:<12}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}\n", "ms", "mean", "median", "P90", "P95", "P99", "max");
  auto row = [&s](const char* name, const Summary& v) {
    s += fmt::format("{:<12}{:>10.2f}{:>10.2f}{:>10.2f}{:>10.2f}{:>10.2f}{:>10.2f}\n", name, v.mean, v.median, v.p90,
                     v.p95, v.p99, v.max);
  };
  row("TTFT", m.ttft);
  row("ITL", m.itl);
  row("TPOT", m.tpot);
  row("E2E", m.e2e);
  if (m.speculation && m.speculation->drafted > 0) {
    const SpecCounters& c = *m.speculation;
    s += fmt::format("Speculative: {:.1f}% of {:.0f} drafts accepted ({:.0f}; {:.0f} of them forced text)\n",
                     100 * c.accepted / c.drafted, c.drafted, c.accepted, c.jump_forward);
  }
  if (m.failed > 0) {
    std::string kinds;
    for (const auto& [k, v] : m.errors) kinds += fmt::format("{}{} {}", kinds.empty() ? "" : ", ", v, k);
    line("Errors", fmt::format("{}", m.failed));
    s += "  by kind: " + kinds + "\n";
    for (const std::string& e : m.error_examples) s += "  e.g. " + e.substr(0, 160) + "\n";
  }
  s += fmt::format("Client: {:.3f} CPU s, {:.1f} us CPU per output token, {:.0f}% of one core; arrival lag P99 {:.2f} ms, "
                   "max {:.2f} ms\n",
                   m.cpu_s, m.cpu_us_per_token, m.cpu_fraction * 100, m.lag_ms.p99, m.lag_ms.max);
  if (m.client_bottleneck) {
    s += "WARNING: the client itself may have been the bottleneck:";
    for (const std::string& r : m.bottleneck_reasons) s += " " + r + ";";
    s += "\n";
  }
  return s;
}

namespace {

std::string xml_escape(const std::string& in) {
  std::string out;
  for (char c : in) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

double nice_step(double range) {
  if (!(range > 0)) return 1;
  const double raw = range / 5;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return mag * (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10);
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

struct Panel {
  double x, y, w, h;
};

// Axes with ticks for [0, xmax] x [0, ymax] inside panel p; returns the plot area.
Panel axes(std::string& svg, const Panel& p, const std::string& title, const std::string& xlabel,
           const std::string& ylabel, double xmax, double ymax) {
  const Panel a{p.x + 55, p.y + 28, p.w - 70, p.h - 70};
  svg += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='14' font-weight='bold'>{}</text>\n", p.x + 55, p.y + 18,
                     xml_escape(title));
  svg += fmt::format("<rect x='{:.1f}' y='{:.1f}' width='{:.1f}' height='{:.1f}' fill='none' stroke='#333'/>\n", a.x,
                     a.y, a.w, a.h);
  const double xs = nice_step(xmax), ys = nice_step(ymax);
  for (double v = 0; v <= xmax * 1.0001; v += xs) {
    const double X = a.x + a.w * v / xmax;
    svg += fmt::format("<line x1='{0:.1f}' y1='{1:.1f}' x2='{0:.1f}' y2='{2:.1f}' stroke='#ddd'/>"
                       "<text x='{0:.1f}' y='{3:.1f}' font-size='10' text-anchor='middle'>{4:g}</text>\n",
                       X, a.y, a.y + a.h, a.y + a.h + 13, v);
  }
  for (double v = 0; v <= ymax * 1.0001; v += ys) {
    const double Y = a.y + a.h - a.h * v / ymax;
    svg += fmt::format("<line x1='{0:.1f}' y1='{1:.1f}' x2='{2:.1f}' y2='{1:.1f}' stroke='#ddd'/>"
                       "<text x='{3:.1f}' y='{4:.1f}' font-size='10' text-anchor='end'>{5:g}</text>\n",
                       a.x, Y, a.x + a.w, a.x - 4, Y + 3, v);
  }
  svg += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='11' text-anchor='middle'>{}</text>\n", a.x + a.w / 2,
                     a.y + a.h + 30, xml_escape(xlabel));
  svg += fmt::format("<text x='{0:.1f}' y='{1:.1f}' font-size='11' text-anchor='middle' "
                     "transform='rotate(-90 {0:.1f} {1:.1f})'>{2}</text>\n",
                     p.x + 14, a.y + a.h / 2, xml_escape(ylabel));
  return a;
}

void polyline(std::string& svg, const Panel& a, const std::vector<std::pair<double, double>>& pts, double xmax,
              double ymax, const char* color) {
  if (pts.empty()) return;
  svg += fmt::format("<polyline fill='none' stroke='{}' stroke-width='1.5' points='", color);
  for (const auto& [x, y] : pts)
    svg += fmt::format("{:.1f},{:.1f} ", a.x + a.w * std::min(x, xmax) / xmax, a.y + a.h - a.h * std::min(y, ymax) / ymax);
  svg += "'/>\n";
}

std::vector<std::pair<double, double>> cdf_points(const std::vector<double>& sorted) {
  std::vector<std::pair<double, double>> pts;
  const size_t n = sorted.size();
  if (n == 0) return pts;
  const size_t step = std::max<size_t>(1, n / 500);
  for (size_t i = 0; i < n; i += step) pts.emplace_back(sorted[i], static_cast<double>(i + 1) / static_cast<double>(n));
  pts.emplace_back(sorted.back(), 1.0);
  return pts;
}

}  // namespace

std::string render_svg(const std::vector<Metrics>& runs, const std::string& title) {
  const double W = 1200, H = 700;
  std::string svg = fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' viewBox='0 0 {} {}' "
      "font-family='sans-serif'>\n<rect width='100%' height='100%' fill='white'/>\n"
      "<text x='20' y='26' font-size='17' font-weight='bold'>{}</text>\n",
      W, H, W, H, xml_escape(title));
  struct Cdf {
    const char* title;
    std::vector<double> Metrics::*values;
  };
  const Cdf cdfs[] = {{"TTFT CDF", &Metrics::ttft_ms},
                      {"Inter-token latency CDF", &Metrics::itl_ms},
                      {"Time per output token CDF", &Metrics::tpot_ms},
                      {"End-to-end latency CDF", &Metrics::e2e_ms}};
  const Panel panels[] = {{0, 40, 400, 330}, {400, 40, 400, 330}, {800, 40, 400, 330}, {0, 370, 400, 330}};
  for (size_t k = 0; k < 4; ++k) {
    double xmax = 0;
    for (const Metrics& m : runs)
      if (!(m.*cdfs[k].values).empty()) xmax = std::max(xmax, (m.*cdfs[k].values).back());
    if (!(xmax > 0)) xmax = 1;
    const Panel a = axes(svg, panels[k], cdfs[k].title, "milliseconds", "fraction of samples", xmax, 1.0);
    for (size_t r = 0; r < runs.size(); ++r) polyline(svg, a, cdf_points(runs[r].*cdfs[k].values), xmax, 1.0, kColors[r % 8]);
  }
  // Throughput over time.
  double tmax = 1, ymax = 1;
  for (const Metrics& m : runs) {
    tmax = std::max(tmax, static_cast<double>(m.tokens_per_second.size()));
    for (double v : m.tokens_per_second) ymax = std::max(ymax, v);
  }
  const Panel a = axes(svg, {400, 370, 800, 330}, "Output tokens per second over time", "seconds since start",
                       "tokens/s", tmax, ymax * 1.05);
  for (size_t r = 0; r < runs.size(); ++r) {
    std::vector<std::pair<double, double>> pts;
    for (size_t i = 0; i < runs[r].tokens_per_second.size(); ++i) {
      pts.emplace_back(static_cast<double>(i), runs[r].tokens_per_second[i]);
      pts.emplace_back(static_cast<double>(i + 1), runs[r].tokens_per_second[i]);
    }
    polyline(svg, a, pts, tmax, ymax * 1.05, kColors[r % 8]);
  }
  // Legend, top right of the throughput panel.
  for (size_t r = 0; r < runs.size(); ++r) {
    const Metrics& m = runs[r];
    const std::string name = (m.label.empty() ? "" : m.label + " ") +
                             (m.rate > 0 && std::isfinite(m.rate) ? fmt::format("{:g} req/s", m.rate) : "unlimited") +
                             (m.max_concurrency > 0 ? fmt::format(", conc {}", m.max_concurrency) : "");
    const double y = a.y + 14 + 16 * static_cast<double>(r);
    svg += fmt::format("<rect x='{:.1f}' y='{:.1f}' width='12' height='10' fill='{}'/>"
                       "<text x='{:.1f}' y='{:.1f}' font-size='11'>{}</text>\n",
                       a.x + a.w - 200, y - 9, kColors[r % 8], a.x + a.w - 183, y, xml_escape(name));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace basalt::loadgen

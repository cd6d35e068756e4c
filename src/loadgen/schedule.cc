#include "loadgen/schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>

#include "core/error.h"

namespace basalt::loadgen {

void LoadShape::validate() const {
  BASALT_CHECK(!std::isnan(rate) && rate >= 0, "--request-rate must be >= 0 (0 or inf: all at once), got {}", rate);
  BASALT_CHECK(std::isfinite(burst_factor) && burst_factor > 0, "--burst-factor must be > 0, got {}", burst_factor);
  BASALT_CHECK(std::isfinite(burst_start_s) && burst_start_s >= 0, "--burst-start must be >= 0 seconds, got {}",
               burst_start_s);
  BASALT_CHECK(std::isfinite(burst_duration_s) && burst_duration_s >= 0,
               "--burst-duration must be >= 0 seconds, got {}", burst_duration_s);
  BASALT_CHECK(std::isfinite(diurnal_amplitude) && diurnal_amplitude >= 0 && diurnal_amplitude <= 1,
               "--diurnal-amplitude must be in [0, 1], got {}", diurnal_amplitude);
  BASALT_CHECK(std::isfinite(diurnal_period_s) && diurnal_period_s > 0, "--diurnal-period must be > 0 seconds, got {}",
               diurnal_period_s);
}

bool LoadShape::unlimited() const { return !(rate > 0) || std::isinf(rate); }

double LoadShape::rate_at(double t) const {
  double r = rate;
  if (burst_duration_s > 0 && t >= burst_start_s && t < burst_start_s + burst_duration_s) r *= burst_factor;
  if (diurnal_amplitude > 0) r *= 1 + diurnal_amplitude * std::sin(2 * std::numbers::pi * t / diurnal_period_s);
  return r;
}

namespace {

// Unit exponential by inverse CDF from 53 random bits.
double unit_exponential(std::mt19937_64& rng) {
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // [0, 1)
  return -std::log1p(-u);
}

}  // namespace

std::vector<double> arrival_times(int64_t n, const LoadShape& shape) {
  shape.validate();
  BASALT_CHECK(n >= 0, "the number of requests must be >= 0, got {}", n);
  std::vector<double> times(static_cast<size_t>(n), 0.0);
  if (shape.unlimited()) return times;
  std::mt19937_64 rng(shape.seed);
  if (shape.diurnal_amplitude > 0) {
    // Thinning: candidates of a Poisson process at the peak rate, each kept
    // with probability rate(t) / peak.
    const double peak = shape.rate * std::max(1.0, shape.burst_factor) * (1 + shape.diurnal_amplitude);
    double t = 0;
    for (int64_t i = 0; i < n;) {
      t += unit_exponential(rng) / peak;
      const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
      if (u * peak < shape.rate_at(t)) times[static_cast<size_t>(i++)] = t;
    }
    return times;
  }
  // The rate is piecewise constant with breakpoints at the burst's edges.
  const bool burst = shape.burst_duration_s > 0 && shape.burst_factor != 1;
  const double b0 = shape.burst_start_s, b1 = shape.burst_start_s + shape.burst_duration_s;
  double t = 0;
  for (int64_t i = 0; i < n; ++i) {
    double need = unit_exponential(rng);  // integrated rate still to cover
    for (;;) {
      const double r = shape.rate_at(t);
      double edge = std::numeric_limits<double>::infinity();
      if (burst) {
        if (t < b0) edge = b0;
        else if (t < b1) edge = b1;
      }
      const double span = edge - t;
      if (need <= span * r) {
        t += need / r;
        break;
      }
      need -= span * r;
      t = edge;
    }
    times[static_cast<size_t>(i)] = t;
  }
  return times;
}

}  // namespace basalt::loadgen

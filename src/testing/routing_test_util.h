// Routing capture and replay, for comparing MoE models across backends.
//
// Why: a token's top-k expert set is a discrete choice. Where two experts'
// biased scores are close, the rounding one backend applies (bf16
// activations, FP8 quantization) moves the router logits enough to choose
// another expert, and a different expert moves the output far more than the
// rounding did. End-to-end logits of two backends are then not comparable
// under a rounding tolerance, even when every op is right. So the tests
// split the claim in two:
//   1. the device's routing is the CPU's routing of the device's own router
//      logits (same ids, weights to 1e-5), and its router logits match the
//      CPU's within the rounding tolerance (RouteReplayer checks both); and
//   2. with the CPU held to the device's routing decisions, every other op
//      agrees within the rounding tolerance (the logits are compared).
// How often the device's choice differs from the CPU's own choice on its own
// logits is counted and reported: it measures how close to ties the model's
// routing sits, not a defect.
//
// RouteRecorder wraps any backend and keeps a host copy of every
// moe_route call's router logits, ids and weights, in call order.
// RouteReplayer wraps a host backend (the CPU's) and, for each moe_route
// call in order, hands out the next recorded decision instead of its own,
// after computing its own decisions for the statistics above. A forward pass
// replayed must make the same sequence of moe_route calls, with the same
// shapes, as the recorded one (the same model config and batch).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "testing/backend_test_util.h"
#include "backend/forwarding_backend.h"
#include "core/error.h"
#include "core/tensor.h"

namespace basalt::testing {

// One moe_route call, copied to host memory.
struct RecordedRoute {
  Tensor logits;   // f32 [T, E]
  Tensor ids;      // i32 [T, k]
  Tensor weights;  // f32 [T, k]
};

class RouteRecorder final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;

  void moe_route_impl(const Tensor& logits, const Tensor* bias, const MoeRouteParams& params,
                      Tensor& ids, Tensor& weights) override {
    inner().moe_route(logits, bias, params, ids, weights);
    routes_.push_back({to_host(logits), to_host(ids), to_host(weights)});
  }

  // The calls since the last take(), and forgets them.
  std::vector<RecordedRoute> take() { return std::exchange(routes_, {}); }

 private:
  Tensor to_host(const Tensor& t) {
    Tensor host = Tensor::empty(t.shape(), t.dtype());
    if (device() == Device::kCpu) {
      std::memcpy(host.raw(), t.raw(), t.nbytes());
    } else {
      inner().copy(t, host);
    }
    return host;
  }

  std::vector<RecordedRoute> routes_;
};

// What a replay saw, summed over its calls.
struct ReplayStats {
  int64_t calls = 0;
  int64_t choices = 0;             // tokens x top_k over all calls
  int64_t own_choice_differs = 0;  // recorded experts absent from this backend's own choice
  int64_t redecided_differs = 0;   // recorded experts absent from this backend's choice on the recorded logits
  double max_weight_error = 0.0;   // |recorded weight - this backend's weight on the recorded logits|
  double max_logits_error = 0.0;   // relative error of the recorded router logits against this backend's, per call
};

class RouteReplayer final : public ForwardingBackend {
 public:
  explicit RouteReplayer(Backend& host_backend) : ForwardingBackend(host_backend) {
    BASALT_CHECK(host_backend.device() == Device::kCpu, "RouteReplayer wraps a host backend");
  }

  // The decisions the next forward passes take, in call order; resets the statistics.
  void replay(std::vector<RecordedRoute> routes) {
    routes_ = std::move(routes);
    next_ = 0;
    per_call_.clear();
  }
  // The statistics summed over calls [begin, end) of this replay (all of
  // them by default; a range past the calls made is cut to them).
  ReplayStats stats(size_t begin = 0, size_t end = SIZE_MAX) const {
    ReplayStats sum;
    const auto first = per_call_.begin() + static_cast<std::ptrdiff_t>(std::min(begin, per_call_.size()));
    const auto last = per_call_.begin() + static_cast<std::ptrdiff_t>(std::min(end, per_call_.size()));
    for (auto it = first; it < last; ++it) {
      const ReplayStats& c = *it;
      sum.calls += c.calls;
      sum.choices += c.choices;
      sum.own_choice_differs += c.own_choice_differs;
      sum.redecided_differs += c.redecided_differs;
      sum.max_weight_error = std::max(sum.max_weight_error, c.max_weight_error);
      sum.max_logits_error = std::max(sum.max_logits_error, c.max_logits_error);
    }
    return sum;
  }
  // Whether every recorded call was used.
  bool consumed_all() const { return next_ == routes_.size(); }

  void moe_route_impl(const Tensor& logits, const Tensor* bias, const MoeRouteParams& params,
                      Tensor& ids, Tensor& weights) override {
    BASALT_CHECK(next_ < routes_.size(), "RouteReplayer: moe_route call {} has no recorded decision", next_);
    const RecordedRoute& r = routes_[next_++];
    BASALT_CHECK(r.logits.shape() == logits.shape() && r.ids.shape() == ids.shape(),
                 "RouteReplayer: call {} does not have the recorded shapes", next_ - 1);
    Tensor own_ids = Tensor::empty(ids.shape(), DType::kI32), own_weights = Tensor::empty(weights.shape(), DType::kF32);
    inner().moe_route(logits, bias, params, own_ids, own_weights);
    const Tensor recorded_logits = r.logits.to_f32();
    Tensor re_ids = Tensor::empty(ids.shape(), DType::kI32), re_weights = Tensor::empty(weights.shape(), DType::kF32);
    inner().moe_route(recorded_logits, bias, params, re_ids, re_weights);

    const int64_t T = ids.dim(0), k = ids.dim(1);
    ReplayStats& call = per_call_.emplace_back();
    call.calls = 1;
    call.choices = T * k;
    call.own_choice_differs = missing_choices(r.ids, own_ids, T, k);
    call.redecided_differs = missing_choices(r.ids, re_ids, T, k);
    call.max_logits_error = relative_error(recorded_logits, logits.to_f32());
    const Tensor recorded_weights = r.weights.to_f32();
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        // Match weights by expert id: order within a token may differ at exact ties.
        const int32_t e = r.ids.data<const int32_t>()[t * k + j];
        for (int64_t i = 0; i < k; ++i) {
          if (re_ids.data<const int32_t>()[t * k + i] != e) continue;
          call.max_weight_error =
              std::max(call.max_weight_error, static_cast<double>(std::fabs(
                                                    recorded_weights.data<const float>()[t * k + j] -
                                                    re_weights.data<const float>()[t * k + i])));
        }
      }
    }
    std::memcpy(ids.raw(), r.ids.raw(), ids.nbytes());
    BASALT_CHECK(weights.dtype() == DType::kF32, "RouteReplayer: f32 weights expected");
    std::memcpy(weights.raw(), recorded_weights.raw(), weights.nbytes());
  }

 private:
  // How many of `want`'s ids per token are not among `got`'s ids for that token.
  static int64_t missing_choices(const Tensor& want, const Tensor& got, int64_t T, int64_t k) {
    int64_t missing = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int32_t* g = got.data<const int32_t>() + t * k;
      for (int64_t j = 0; j < k; ++j) {
        missing += std::find(g, g + k, want.data<const int32_t>()[t * k + j]) == g + k ? 1 : 0;
      }
    }
    return missing;
  }

  std::vector<RecordedRoute> routes_;
  size_t next_ = 0;
  std::vector<ReplayStats> per_call_;
};

}  // namespace basalt::testing

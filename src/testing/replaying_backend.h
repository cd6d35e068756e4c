// A CPU stand-in for CUDA graphs, for tests of code that records and
// replays steps (model/graphed_model.h, graphs on DP ranks).
//
// Contract: test-only. ReplayingCpuBackend is a CpuBackend (on a pool of
// its own threads, so that ranks on threads of one process do not share
// one) whose record(ops) keeps ops without running them and whose
// replay() runs them again, as a CUDA graph's replay repeats its kernels:
// the host logic inside ops runs on every replay, so a replay that does
// not do what the recording would have done shows in the results.
// RecordableCommunicator passes every collective to the communicator it
// wraps and says it can be recorded (Communicator::can_record), which on
// these backends means its collectives run again on each replay.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <utility>

#include "backend/communicator.h"
#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"

namespace basalt::testing {

class ReplayingCpuBackend final : public CpuBackend {
 public:
  // threads <= 0: one per hardware thread (ThreadPool's rule).
  explicit ReplayingCpuBackend(cpu::Bf16Activations mode = cpu::Bf16Activations::kRounded, int threads = 0)
      : ReplayingCpuBackend(std::make_unique<ThreadPool>(threads), mode) {}

  std::unique_ptr<RecordedOps> record(const std::function<void()>& ops) override {
    class Replay final : public RecordedOps {
     public:
      explicit Replay(std::function<void()> ops) : ops_(std::move(ops)) {}
      void replay() override { ops_(); }

     private:
      std::function<void()> ops_;
    };
    ++recordings;
    return std::make_unique<Replay>(ops);
  }
  bool can_record() const override { return true; }
  int recordings = 0;

 private:
  ReplayingCpuBackend(std::unique_ptr<ThreadPool> pool, cpu::Bf16Activations mode)
      : CpuBackend(pool.get(), mode), pool_(std::move(pool)) {}
  std::unique_ptr<ThreadPool> pool_;
};

// Passes every collective to the communicator it wraps; says it can be
// recorded. Tests derive from it to watch collectives.
class RecordableCommunicator : public Communicator {
 public:
  explicit RecordableCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  void all_reduce(Tensor& x, ReduceOp op) override { inner_->all_reduce(x, op); }
  void all_gather(const Tensor& x, Tensor& out) override { inner_->all_gather(x, out); }
  void reduce_scatter(const Tensor& x, Tensor& out, ReduceOp op) override { inner_->reduce_scatter(x, out, op); }
  void all_to_all(const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                  std::span<const int64_t> recv_rows) override {
    inner_->all_to_all(send, send_rows, recv, recv_rows);
  }
  void broadcast(Tensor& x, int root) override { inner_->broadcast(x, root); }
  bool can_record() const override { return true; }

 private:
  std::unique_ptr<Communicator> inner_;
};

}  // namespace basalt::testing

// The scheduler's own cost per step, without a model: N requests decoding
// together (8-token prompts, 64 output tokens each), driven by a runner that
// samples a fixed token. Reports schedule() and update() time per step (CPU
// time of this thread, best of --repeats runs) at each N. This is the part
// of basalt_bench_engine's "sched us/step" that is the scheduler's; the rest
// is the engine's inbox, metrics and hand-off to the delivery thread.
//
// --flush-mb N reads N MiB of other memory before each schedule() and each
// update(), as the forward pass between them does in the engine (it streams
// the weights through the caches): the scheduler then meets its requests
// cold, which is what its cost in the engine is made of. 0 (the default)
// measures it with everything hot.
//
//   basalt_bench_scheduler [--running 1,32,256] [--tokens N] [--repeats N] [--page N] [--flush-mb N]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/kv_manager.h"
#include "runtime/scheduler.h"

namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Timing {
  double schedule_us = 0, update_us = 0;
  int steps = 0;
};

// Streams `buffer` through the caches; the sum keeps the reads.
volatile uint64_t g_flush_sink = 0;
void flush_caches(const std::vector<uint64_t>& buffer) {
  uint64_t sum = 0;
  for (size_t i = 0; i < buffer.size(); i += 8) sum += buffer[i];
  g_flush_sink = g_flush_sink + sum;
}

Timing run(int running, int tokens, int32_t page, const std::vector<uint64_t>& flush) {
  const int64_t slots = static_cast<int64_t>(running) * (8 + tokens + page) * 2;
  basalt::KvManager kv(slots - slots % page, page);
  basalt::SchedulerOptions o;
  o.max_running = running;
  o.step_token_budget = 8192;
  o.vocab_size = 32000;
  o.max_context = 4096;
  o.eos_ids = {2};
  o.stop_strings = false;
  basalt::Scheduler scheduler(kv, o);
  std::vector<basalt::RequestUpdate> updates;
  for (int i = 0; i < running; ++i) {
    auto r = std::make_unique<basalt::Request>();
    r->id = static_cast<uint64_t>(i + 1);
    for (int t = 0; t < 8; ++t) r->request.prompt.push_back(100 + (i * 8 + t) % 30000);
    r->request.params.max_tokens = tokens;
    r->request.params.ignore_eos = true;
    r->request.params.temperature = 0;
    r->request.params.seed = 1;
    r->submitted = basalt::Clock::now();
    scheduler.add(std::move(r), updates);
  }
  Timing t;
  while (scheduler.has_requests()) {
    updates.clear();
    flush_caches(flush);
    const double a = thread_cpu_seconds();
    std::shared_ptr<basalt::StepPlan> plan = scheduler.schedule(updates);
    const double b = thread_cpu_seconds();
    if (!plan) break;
    basalt::StepResult result;
    result.next.assign(plan->rows.size(), 7);
    result.logprobs.assign(plan->rows.size(), {});
    result.sampled_logprobs.assign(plan->rows.size(), 0.0f);
    result.exec_start = result.exec_end = basalt::Clock::now();
    flush_caches(flush);
    const double c = thread_cpu_seconds();
    scheduler.update(*plan, result, updates);
    const double d = thread_cpu_seconds();
    // Decode steps only: the first step prefills every prompt.
    if (t.steps++ > 0) {
      t.schedule_us += (b - a) * 1e6;
      t.update_us += (d - c) * 1e6;
    }
  }
  t.schedule_us /= std::max(1, t.steps - 1);
  t.update_us /= std::max(1, t.steps - 1);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> running = {1, 32, 256};
  int tokens = 64, repeats = 5;
  int32_t page = 1;
  int flush_mb = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--running") {
      running.clear();
      std::stringstream ss(value);
      for (std::string item; std::getline(ss, item, ',');) running.push_back(std::stoi(item));
    } else if (flag == "--tokens") {
      tokens = std::stoi(value);
    } else if (flag == "--repeats") {
      repeats = std::stoi(value);
    } else if (flag == "--page") {
      page = std::stoi(value);
    } else if (flag == "--flush-mb") {
      flush_mb = std::stoi(value);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  std::printf("scheduler alone: 8-token prompts, %d output tokens each, page %d; %d MiB read between calls; best "
              "of %d\n",
              tokens, page, flush_mb, repeats);
  const std::vector<uint64_t> flush(static_cast<size_t>(flush_mb) << 17, 1);
  std::printf("%-8s %8s %14s %14s %14s\n", "running", "steps", "schedule us", "update us", "total us");
  for (int n : running) {
    Timing best;
    for (int r = 0; r < repeats; ++r) {
      const Timing t = run(n, tokens, page, flush);
      if (r == 0 || t.schedule_us + t.update_us < best.schedule_us + best.update_us) best = t;
    }
    std::printf("%-8d %8d %14.1f %14.1f %14.1f\n", n, best.steps, best.schedule_us, best.update_us,
                best.schedule_us + best.update_us);
  }
  return 0;
}

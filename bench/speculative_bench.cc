// basalt_bench_speculative: what speculative decoding gains at batch 1, on
// the bundled model on the CPU backend, or any model directory on any
// device. Each workload runs greedy, plain, with n-gram drafts of each
// --k, with the model's MTP layer drafting (chained, each --k) where it has
// one, and with a draft model (--draft-model; models/basalt-draft for the
// bundled model) drafting each --k, and with an EAGLE head (--eagle DIR,
// tools/train/train_eagle.py; models/basalt-mini-eagle for the bundled
// model) drafting each --k, and with a predicted output (OpenAI's
// `prediction`: the request's own drafts, no proposer; here plain decoding's
// own text with a phrase inserted in its middle), alternated, best of
// --repeats; the outputs must be equal token for
// token (the program fails otherwise on the CPU; on a GPU it says from
// which token they differ). Reported: output tokens/s and the
// ratio to plain decoding; engine steps; the drafts' acceptance; the ideal
// speedup the acceptance implies (tokens per step against plain's, as if a
// verification step cost what a decode step costs) and how much of it the
// speedup reaches.
//
//   basalt_bench_speculative [--tokens N] [--repeats N] [--k 2,4] [--model DIR] [--draft-model DIR]
//                            [--eagle DIR] [--device cpu|cuda] [--eager] [--no-overlap] [--only mtp,...] [--profile]
//                            [--work copy|free] [--batch-invariant]
//
// --batch-invariant runs the backend's batch-invariant mode (backend.h; the
// CPU always is): then a GPU must match plain decoding token for token too.
//
// Each run has an engine of its own, which first decodes another short text
// (recording the CUDA graphs of the step shapes it meets, as a server does
// once), so the timed request sees the steady state.
//
// Overlap is on with cuda (--no-overlap turns it off), off on the CPU.
// --only keeps the listed algorithms (plain is always run: the others are
// measured against it); --work runs one workload. Both are there to profile
// one mode (say under ncu) without the rest. --profile (cuda) adds one run
// per mode, the first k, with the backend's op events on: GPU time per step
// by op (a graph replay is one op) against the step's wall time.
//
// Workloads: "copy" asks for a passage to be written out again and starts
// the copy (an edit of a given text: most of the output is in the prompt);
// "free" continues a sentence.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "app/device_choice.h"
#include "bench_util.h"
#include "model/eagle_head.h"
#include "model/graphed_model.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "tokenizer/tokenizer.h"
#ifdef BASALT_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace {

using namespace basalt;

const char* kPassage =
    "The package maintainer keeps a small list of changes for each release. Every change names the file it "
    "touches, the reason for it and the person who asked for it. Before a release the list is read once more, "
    "the tests are run on a clean machine, and the archive is signed. When a change breaks something, it is "
    "taken out again and the release waits a day.";

// What each engine decodes before the timed request (see run()).
const char* kWarmUp =
    "A short note to start with: the weather was mild, the trains ran on time, and the market opened early.";

struct Workload {
  const char* name;
  std::string prompt;
  std::string prediction;  // a predicted output (the "predict" mode's; set from plain decoding's text)
};

struct Result {
  double tokens_per_s = 0;
  uint64_t steps = 0, tokens = 0, drafted = 0, accepted = 0;
  std::vector<int32_t> output;
  // Per step, the engine's own split (EngineMetrics): the runner's wall
  // time, the engine thread's CPU time outside it, the runner's idle gap.
  double execute_us = 0, schedule_us = 0, bubble_us = 0;
  double wall_s = 0;  // the timed request, submit to its last token
};

// A way to decode: plain, or an algorithm with k drafts.
struct Mode {
  std::string algorithm;  // "none", "ngram", "mtp", "eagle", "draft", "predict" (a predicted output, no proposer)
  int k = 0;
  // The step returns once the head's drafts are on the host too (what
  // SpeculativeOptions::drafts_behind_samples saves; k = 1 heads only).
  bool wait_for_drafts = false;
  std::string name() const {
    if (algorithm == "none" || algorithm == "predict") return algorithm == "none" ? "plain" : "predicted";
    return algorithm + " k=" + std::to_string(k) + (wait_for_drafts ? " wait" : "");
  }
};

Result run(Model& model, Backend& backend, const Tokenizer& tok, const Workload& work, const Mode& mode,
           const std::shared_ptr<Model>& draft, int tokens, bool overlap,
           const std::function<void()>& after_warm_up = {}) {
  const std::string& prompt = work.prompt;
  EngineOptions o;
  o.overlap = overlap;
  o.max_running = 1;
  o.kv_slots = 4096;
  o.kv_dtype = kv_cache_dtype("auto", backend);
  if (mode.algorithm != "none" && mode.algorithm != "predict") o.speculative = speculative_options(mode.algorithm, mode.k);
  if (mode.algorithm == "draft") o.draft_model = draft;
  o.speculative.drafts_behind_samples = !mode.wait_for_drafts;
  o.speculative.adaptive_from_batch = adaptive_drafts_from_batch(backend);
  Engine engine(model, backend, &tok, o);
  SamplingParams p;
  p.max_tokens = tokens;
  p.temperature = 0.0f;
  p.ignore_eos = true;
  // A server records its CUDA graphs once; a new engine (new KV memory)
  // records them again, so each engine first decodes another text, which
  // records the step shapes this mode meets and leaves the timed request
  // the steady state. Its metrics are left out below.
  SamplingParams warm = p;
  warm.max_tokens = std::min(tokens, 48);
  RequestHandle warming = engine.submit({tok.encode(kWarmUp, true), warm, 0, 0, std::nullopt, nullptr, {}, {}});
  (void)collect(*warming);
  const EngineMetrics before = engine.metrics();
  if (after_warm_up) after_warm_up();
  const auto start = bench::Clock::now();
  EngineRequest request{tok.encode(prompt, true), p, 0, 0, std::nullopt, nullptr, {}, {}};
  if (mode.algorithm == "predict") request.prediction = tok.encode(work.prediction, false);
  RequestHandle h = engine.submit(std::move(request));
  const RequestOutput out = collect(*h);
  const double wall = bench::seconds_since(start);
  if (out.reason == FinishReason::kError) {
    std::fprintf(stderr, "request failed: %s\n", out.error.c_str());
    std::exit(1);
  }
  const EngineMetrics m = engine.metrics();
  const auto per_step_us = [&](const Histogram& now, const Histogram& was) {
    return now.count > was.count ? (now.sum - was.sum) * 1e6 / static_cast<double>(now.count - was.count) : 0.0;
  };
  return {static_cast<double>(m.output_tokens - before.output_tokens) / wall,
          m.steps - before.steps,
          m.output_tokens - before.output_tokens,
          m.draft_tokens - before.draft_tokens,
          m.accepted_draft_tokens - before.accepted_draft_tokens,
          out.output_ids,
          per_step_us(m.execute_time, before.execute_time),
          per_step_us(m.schedule_time, before.schedule_time),
          per_step_us(m.bubble, before.bubble),
          wall};
}

}  // namespace

int main(int argc, char** argv) {
  int tokens = 128, repeats = 3;
  std::vector<int> ks = {2, 4};
  std::string dir = std::string(BASALT_SOURCE_DIR) + "/models/basalt-mini";
  std::string draft_dir;  // default: the bundled draft model beside the bundled model
  std::string eagle_dir;
  std::string device = "cpu";
  bool eager = false, no_overlap = false, profile = false, batch_invariant = false;
  std::string only, only_work;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--eager" || flag == "--no-overlap" || flag == "--profile" || flag == "--batch-invariant") {
      (flag == "--eager"             ? eager
       : flag == "--profile"         ? profile
       : flag == "--batch-invariant" ? batch_invariant
                                     : no_overlap) = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", flag.c_str());
      return 2;
    }
    const char* v = argv[++i];
    if (flag == "--tokens") tokens = std::atoi(v);
    else if (flag == "--repeats") repeats = std::max(1, std::atoi(v));
    else if (flag == "--model") dir = v;
    else if (flag == "--draft-model") draft_dir = v;
    else if (flag == "--eagle") eagle_dir = v;
    else if (flag == "--device") device = v;
    else if (flag == "--only") only = std::string(",") + v + ",";
    else if (flag == "--work") only_work = v;
    else if (flag == "--k") {
      ks.clear();
      for (const char* p = v; *p;) {
        ks.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  std::unique_ptr<Backend> backend_owner = make_backend(device);
  Backend& backend = *backend_owner;
  if (batch_invariant) backend.set_batch_invariant(true);
  // Overlap on a GPU (--no-overlap: off) for every mode: plain decoding
  // overlaps, speculative steps run one at a time. (It measured even with
  // overlap off on the H200, bench/README.md; plain decoding gets it here so
  // that the speedups are against the best of the two.)
  const bool overlap = !no_overlap && backend.device() != Device::kCpu;
  std::unique_ptr<Model> model = load_model(dir, backend);
  if (!eager && backend.can_record()) model = make_graphed_model(std::move(model), backend, {.max_batch = 8});
  if (draft_dir.empty() && dir == std::string(BASALT_SOURCE_DIR) + "/models/basalt-mini")
    draft_dir = std::string(BASALT_SOURCE_DIR) + "/models/basalt-draft";
  if (eagle_dir.empty() && dir == std::string(BASALT_SOURCE_DIR) + "/models/basalt-mini")
    eagle_dir = std::string(BASALT_SOURCE_DIR) + "/models/basalt-mini-eagle";
  std::shared_ptr<Model> draft;
  if (!draft_dir.empty()) {
    std::unique_ptr<Model> loaded = load_model(draft_dir, backend);
    if (!eager && backend.can_record()) loaded = make_graphed_model(std::move(loaded), backend, {.max_batch = 8});
    draft = std::move(loaded);
  }
  // The EAGLE head drafts for a second copy of the model (the first keeps
  // its own MTP layer as its draft head).
  std::unique_ptr<Model> with_eagle;
  if (!eagle_dir.empty()) {
    std::unique_ptr<Model> target = load_model(dir, backend);
    std::unique_ptr<DraftHead> head = load_eagle_head(eagle_dir, backend, dir);
    with_eagle = with_draft_head(std::move(target), std::move(head));
    if (!eager && backend.can_record()) with_eagle = make_graphed_model(std::move(with_eagle), backend, {.max_batch = 8});
  }
  const Tokenizer tok = Tokenizer::from_file(dir + "/tokenizer.json");
  const std::vector<Workload> workloads = {
      {"copy", std::string("Here is a text.\n\n") + kPassage + "\n\nThe same text, written out again:\n\nThe package",
       ""},
      {"free", "Once upon a time, in a small town by the sea,", ""}};
  std::printf("%s, %s backend%s, greedy, %d output tokens, batch 1, overlap %s, best of %d\n", dir.c_str(),
              device.c_str(), batch_invariant ? " (batch-invariant)" : "", tokens, overlap ? "on" : "off", repeats);
  std::printf("%-6s %-10s %10s %8s %7s %11s %8s %10s %10s\n", "work", "mode", "tokens/s", "vs plain", "steps",
              "acceptance", "tok/step", "ideal", "of ideal");
  const auto wanted = [&](const char* algorithm) {
    return only.empty() || only.find(std::string(",") + algorithm + ",") != std::string::npos;
  };
  for (const Workload& w : workloads) {
    if (!only_work.empty() && only_work != w.name) continue;
    std::vector<Mode> modes = {{"none", 0}};
    if (wanted("ngram"))
      for (const int k : ks) modes.push_back({"ngram", k});
    // A head's k = 1 drafts come back behind the samples; "wait" is the
    // same decoding with the step waiting for them, alternated with it.
    if (model->draft_head() != nullptr && wanted("mtp"))
      for (const int k : ks) {
        modes.push_back({"mtp", k});
        if (k == 1) modes.push_back({"mtp", k, true});
      }
    if (with_eagle && wanted("eagle"))
      for (const int k : ks) {
        modes.push_back({"eagle", k});
        if (k == 1) modes.push_back({"eagle", k, true});
      }
    if (draft && wanted("draft"))
      for (const int k : ks) modes.push_back({"draft", k});
    if (wanted("predict")) modes.push_back({"predict", 0});
    std::vector<Result> best(modes.size());
    for (int r = 0; r < repeats; ++r)
      for (size_t m = 0; m < modes.size(); ++m) {
        Model& target = modes[m].algorithm == "eagle" ? *with_eagle : *model;
        // A predicted output is the plain run's own text with a phrase
        // inserted in its middle (an edit the model does not make), as a
        // client re-generating a document would send it.
        Workload work = w;
        if (modes[m].algorithm == "predict") {
          const std::string text = tok.decode(best[0].output, true);
          work.prediction = text.substr(0, text.size() / 2) + " (an inserted phrase)" + text.substr(text.size() / 2);
        }
        Result x = run(target, backend, tok, work, modes[m], draft, tokens, overlap);
        if (x.tokens_per_s > best[m].tokens_per_s) best[m] = std::move(x);
      }
    const double plain_per_step = static_cast<double>(best[0].tokens) / static_cast<double>(best[0].steps);
    for (size_t m = 0; m < modes.size(); ++m) {
      const Result& x = best[m];
      const std::string mode = modes[m].name();
      if (x.output != best[0].output) {
        // On a batch-invariant backend (the CPU; a GPU with
        // --batch-invariant) the outputs are equal bit for bit, and so are a
        // GPU's default kernels' at batch 1 up to k = 4 on MLA models (a
        // verification row is its decode step's bits: bench/README, "Exact
        // verification rows by default"); beyond that a GPU's default
        // kernels round k + 1 rows otherwise than one, which can flip a near
        // tie. Reported, and the figures still shown.
        const auto at = std::mismatch(x.output.begin(), x.output.end(), best[0].output.begin(), best[0].output.end());
        std::fprintf(stderr, "%s, %s: the output differs from plain decoding from token %zu\n", w.name, mode.c_str(),
                     static_cast<size_t>(at.first - x.output.begin()));
        if (backend.batch_invariant()) return 1;
      }
      const double per_step = static_cast<double>(x.tokens) / static_cast<double>(x.steps);
      const double speedup = x.tokens_per_s / best[0].tokens_per_s;
      const double ideal = per_step / plain_per_step;
      const double acceptance = x.drafted ? static_cast<double>(x.accepted) / static_cast<double>(x.drafted) : 0.0;
      std::printf("%-6s %-10s %10.1f %7.2fx %7llu %10.0f%% %8.2f %9.2fx %9.0f%%\n", w.name, mode.c_str(),
                  x.tokens_per_s, speedup, static_cast<unsigned long long>(x.steps), 100.0 * acceptance, per_step,
                  ideal, 100.0 * speedup / ideal);
    }
  }
#ifdef BASALT_HAVE_CUDA
  // Where a step's time goes on the GPU: one more run of each mode (the
  // first workload kept, the first k) with the backend's op events on
  // (graph replays count as one op), per step: the GPU time of each op
  // against the step's wall time. Events cost launches, so these runs are
  // a little slower than the table's.
  if (auto* cuda = dynamic_cast<CudaBackend*>(&backend); profile && cuda != nullptr) {
    const Workload& w = only_work == "free" ? workloads[1] : workloads[0];
    std::vector<Mode> profiled;
    for (const char* algorithm : {"none", "ngram", "mtp", "eagle", "draft"}) {
      if (std::string(algorithm) != "none" && !wanted(algorithm)) continue;
      if (std::string(algorithm) == "mtp" && model->draft_head() == nullptr) continue;
      if (std::string(algorithm) == "eagle" && !with_eagle) continue;
      if (std::string(algorithm) == "draft" && !draft) continue;
      const Mode mode{algorithm, std::string(algorithm) == "none" ? 0 : ks.front()};
      profiled.push_back(mode);
      if ((mode.algorithm == "mtp" || mode.algorithm == "eagle") && mode.k == 1)
        profiled.push_back({algorithm, 1, true});
    }
    for (const Mode& mode : profiled) {
      Model& target = mode.algorithm == "eagle" ? *with_eagle : *model;
      const Result x = run(target, backend, tok, w, mode, draft, tokens, overlap, [&] { cuda->set_profiling(true); });
      const double wall_us = x.wall_s * 1e6 / static_cast<double>(x.steps);
      const std::vector<OpTime> ops = cuda->profile();
      cuda->set_profiling(false);
      double gpu_ms = 0;
      for (const OpTime& o : ops) gpu_ms += o.ms;
      const double steps = static_cast<double>(x.steps);
      std::printf("\nprofile, %s %s: %llu steps, wall %.1f us/step, GPU %.1f us/step (%.0f%%); engine: run %.1f, "
                  "host outside it %.1f, gap between runs %.1f us/step\n",
                  w.name, mode.name().c_str(), static_cast<unsigned long long>(x.steps), wall_us,
                  gpu_ms * 1e3 / steps, 100.0 * gpu_ms * 1e3 / steps / wall_us, x.execute_us, x.schedule_us,
                  x.bubble_us);
      for (const OpTime& o : ops)
        if (o.ms * 1e3 / steps >= 1.0)
          std::printf("  %-28s %7.2f calls/step %8.1f us/step\n", o.op.c_str(), static_cast<double>(o.calls) / steps,
                      o.ms * 1e3 / steps);
    }
  }
#endif
  // Which steps replayed graphs (a head pass that runs directly costs its
  // launches; this says whether that happened).
  const auto say = [](const char* name, const Model* m) {
    if (m == nullptr) return;
    const GraphStats g = graph_stats(*m);
    std::fprintf(stderr, "graphs, %s: %lld replays, %lld direct; head %lld replays, %lld direct\n", name,
                 static_cast<long long>(g.replays), static_cast<long long>(g.direct),
                 static_cast<long long>(g.head_replays), static_cast<long long>(g.head_direct));
  };
  say("target", model.get());
  say("target with the EAGLE head", with_eagle.get());
  say("draft model", draft.get());
}

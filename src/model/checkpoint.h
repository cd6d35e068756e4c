// Checkpoint: the tensors of a Hugging Face model directory.
//
// Contract: Checkpoint::open(dir) reads, in order of preference,
//   1. model.safetensors.index.json, whose "weight_map" names the shard file
//      of every tensor (shard names must be plain file names inside dir),
//   2. model.safetensors,
//   3. every *.safetensors file in dir, merged.
// Every file is memory-mapped and fully validated on open (see safetensors.h),
// so a corrupt or hostile checkpoint fails on open with a message naming the
// file and the tensor, before any weight is used. A tensor name that appears
// in two files is an error: which copy a loader would pick is undefined.
//
// get() returns zero-copy, read-only views into the mappings; they stay
// valid after the Checkpoint is destroyed. Pages are read from disk on first
// touch, so a large model's first forward pass would stall on I/O; callers
// that want the cost up front (with a progress line) call prefetch().
//
// Checkpoint::random(spec, label) is a checkpoint of random weights for a
// config (RandomWeightsSpec says what of it matters), with no file behind it, for benchmarks at full shape where no
// weights can be downloaded: get(name, shape) returns a tensor of the shape
// asked for, in the dtype a Hugging Face checkpoint of that config has
// (bf16; float8_e4m3fn for a block-FP8 DeepSeek's decoder linears, with
// float32 weight_scale_inv), holding values of a weight's size (norms are
// ones, scales 0.05, linear weights uniform in +-0.05 or e4m3 codes up to
// 1.875); has() answers as such a checkpoint would (no fused experts, no MTP
// layer). The values are views into a few shared buffers of random values
// (each tensor starts at an offset its name picks), so a 671B-parameter
// model costs about its largest tensor in host memory and no generation
// time. The model computes garbage, at the speed of the real weights.
//
// A Checkpoint is immutable after open and safe to read from many threads.
// It records which tensors were read (get, find, info, require), so a loader
// can check that the config used every tensor (unused()): a config that
// disagrees with its checkpoint must fail, not load a different model.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "model/safetensors.h"

namespace basalt {

// What Checkpoint::random needs to know of a config.
struct RandomWeightsSpec {
  bool fp8_linears = false;   // block-FP8 decoder linears (a DeepSeek quantization_config)
  bool tied_lm_head = false;  // tie_word_embeddings: no lm_head.weight
  bool router_bias = false;   // DeepSeek-V3's gate.e_score_correction_bias
  int64_t num_layers = 0;     // model.layers.<num_layers>.* (an MTP layer) is left out
};

struct CheckpointTensorInfo {
  DType dtype = DType::kF32;
  Shape shape;
  std::string file;  // path of the file that holds the tensor
  uint64_t nbytes = 0;
};

class Checkpoint {
 public:
  // Called with (0, total) first, then after each chunk read, and last with
  // done == total.
  using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

  static Checkpoint open(const std::string& dir);
  static Checkpoint random(const RandomWeightsSpec& spec, const std::string& label);

  const std::string& dir() const { return dir_; }
  // Tensor names, sorted.
  std::vector<std::string> names() const;
  bool has(std::string_view name) const;
  // Paths of the safetensors files the tensors come from, in open order.
  std::vector<std::string> files() const;
  // Sum of the tensors' data sizes, in bytes.
  uint64_t total_bytes() const { return total_bytes_; }

  // These throw "<dir>: tensor '<name>' not found in checkpoint" when absent.
  void require(std::string_view name) const;
  CheckpointTensorInfo info(std::string_view name) const;
  Tensor get(std::string_view name) const;
  // Also throws "<file>: tensor '<name>': shape [a, b] does not match the
  // config's [c, d]" when the stored shape differs from `expected_shape`.
  Tensor get(std::string_view name, const Shape& expected_shape) const;
  // For tensors a model may or may not have (biases, an untied lm_head).
  std::optional<Tensor> find(std::string_view name) const;

  // Reads every page of tensor data into the page cache (advising the kernel
  // to read ahead), reporting progress after each chunk. Blocks until done.
  void prefetch(const ProgressFn& progress = {}) const;

  // The tensors nothing has read yet (get, find, info, require), sorted.
  std::vector<std::string> unused() const;

 private:
  struct RandomWeights;
  Checkpoint() = default;
  const SafetensorsFile& file_of(std::string_view name) const;

  std::shared_ptr<RandomWeights> random_;  // set: Checkpoint::random
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  // Tensor name to the index in files_ of the file that holds it.
  std::map<std::string, size_t, std::less<>> file_index_;
  uint64_t total_bytes_ = 0;
  struct UseLog {
    std::mutex mu;
    std::set<std::string, std::less<>> read;
  };
  std::shared_ptr<UseLog> used_ = std::make_shared<UseLog>();
};

// A Checkpoint::ProgressFn that shows "\rloading weights: 37% (1.2/3.3 GB)",
// redrawn at most every 100 ms, ending with a newline when done == total. It
// stays silent for loads under kMinTotalBytes (too fast to need it) and when
// the output is not a terminal (so logs and pipes get no carriage returns).
class ProgressPrinter {
 public:
  static constexpr uint64_t kMinTotalBytes = 256ull << 20;
  static constexpr std::chrono::milliseconds kInterval{100};

  // Prints to stderr when stderr is a terminal.
  ProgressPrinter();
  // Prints to `out` when `out_is_terminal` is true (tests pass a plain file).
  ProgressPrinter(std::FILE* out, bool out_is_terminal, std::string label = "loading weights");

  void operator()(uint64_t done, uint64_t total);

 private:
  std::FILE* out_;
  bool enabled_;
  std::string label_;
  bool drawn_ = false;     // a line is on screen and not yet finished
  bool finished_ = false;  // the last call completed a line
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace basalt

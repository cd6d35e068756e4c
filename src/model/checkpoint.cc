#include "model/checkpoint.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <system_error>

#include "core/dtype.h"
#include "core/error.h"

namespace basalt {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kIndexFile = "model.safetensors.index.json";
constexpr std::string_view kSingleFile = "model.safetensors";
// Real index files are a few MB at most; anything far larger is not one.
constexpr uintmax_t kMaxIndexBytes = 100'000'000;

std::string join(const std::string& dir, std::string_view file) {
  return (fs::path(dir) / fs::path(file)).string();
}

// Shard names come from the index file: only plain names inside the model
// directory are accepted, so an index cannot point the loader at other files.
bool is_plain_file_name(std::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string_view("/\\\0", 3)) == std::string_view::npos;
}

std::string read_index(const std::string& path) {
  std::error_code error;
  const uintmax_t size = fs::file_size(path, error);
  if (error) fail("{}: cannot read: {}", path, error.message());
  if (size > kMaxIndexBytes) fail("{}: {} bytes is too large for an index file", path, size);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) fail("{}: read failed", path);
  return std::move(text).str();
}

// Returns the weight_map of an index file: tensor name -> shard file name.
std::map<std::string, std::string> parse_index(const std::string& path) {
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_index(path));
  } catch (const nlohmann::json::exception& error) {
    fail("{}: not valid JSON: {}", path, printable_name(error.what()));
  }
  if (!index.is_object()) fail("{}: must be a JSON object", path);
  const auto weight_map = index.find("weight_map");
  if (weight_map == index.end()) fail("{}: missing \"weight_map\"", path);
  if (!weight_map->is_object()) fail("{}: \"weight_map\" must be an object", path);
  std::map<std::string, std::string> shard_of;
  for (const auto& [name, shard] : weight_map->items()) {
    if (!shard.is_string()) {
      fail("{}: tensor '{}': shard must be a file name string", path, printable_name(name));
    }
    const auto& shard_name = shard.get_ref<const std::string&>();
    if (!is_plain_file_name(shard_name)) {
      fail("{}: tensor '{}': shard '{}' is not a plain file name in the model directory", path,
           printable_name(name), printable_name(shard_name));
    }
    shard_of.emplace(name, shard_name);
  }
  if (shard_of.empty()) fail("{}: \"weight_map\" lists no tensors", path);
  return shard_of;
}

bool is_regular_file(const std::string& path) {
  std::error_code error;
  return fs::is_regular_file(path, error);  // follows symlinks, as the Hugging Face cache uses
}

}  // namespace

// --- Random weights (Checkpoint::random) -----------------------------------

// The values: for each (dtype, kind), one period of kPeriod random bytes in
// a memory file, mapped twice in a row (the window: any tensor of up to a
// period, at any offset in the first, is a view of it); a larger tensor gets
// a mapping of its own that repeats the period as often as it needs. So
// every tensor is a zero-copy view, and a 671B-parameter model costs a few
// periods of memory.
class RandomValues {
 public:
  static constexpr size_t kPeriod = 32u << 20;

  explicit RandomValues(const std::function<void(uint8_t*, size_t)>& fill) {
    fd_ = ::memfd_create("basalt-random-weights", MFD_CLOEXEC);
    BASALT_CHECK(fd_ >= 0, "random weights: memfd_create failed: {}", std::strerror(errno));
    BASALT_CHECK(::ftruncate(fd_, kPeriod) == 0, "random weights: ftruncate failed: {}", std::strerror(errno));
    void* period = ::mmap(nullptr, kPeriod, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    BASALT_CHECK(period != MAP_FAILED, "random weights: mmap failed: {}", std::strerror(errno));
    fill(static_cast<uint8_t*>(period), kPeriod);
    ::munmap(period, kPeriod);
    window_ = map_repeated(2 * kPeriod);
  }
  ~RandomValues() {
    ::munmap(window_, 2 * kPeriod);
    ::close(fd_);
  }
  RandomValues(const RandomValues&) = delete;
  RandomValues& operator=(const RandomValues&) = delete;

  // `bytes` of the values from `offset` (< kPeriod) on, kept mapped while
  // the returned owner lives (it keeps `self` alive too).
  static std::pair<const uint8_t*, std::shared_ptr<void>> view(const std::shared_ptr<RandomValues>& self,
                                                               size_t offset, size_t bytes) {
    if (offset + bytes <= 2 * kPeriod) return {static_cast<const uint8_t*>(self->window_) + offset, self};
    const size_t size = (offset + bytes + kPeriod - 1) / kPeriod * kPeriod;
    void* region = self->map_repeated(size);
    std::shared_ptr<void> owner(region, [self, size](void* p) { ::munmap(p, size); });
    return {static_cast<const uint8_t*>(region) + offset, owner};
  }

 private:
  // A read-only mapping of `size` bytes (a multiple of kPeriod) that repeats
  // the period.
  void* map_repeated(size_t size) const {
    void* base = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    BASALT_CHECK(base != MAP_FAILED, "random weights: cannot reserve {} bytes: {}", size, std::strerror(errno));
    for (size_t at = 0; at < size; at += kPeriod) {
      void* p = ::mmap(static_cast<uint8_t*>(base) + at, kPeriod, PROT_READ, MAP_SHARED | MAP_FIXED, fd_, 0);
      if (p == MAP_FAILED) {
        const int error = errno;
        ::munmap(base, size);
        fail("random weights: mmap failed: {}", std::strerror(error));
      }
    }
    return base;
  }

  int fd_ = -1;
  void* window_ = nullptr;
};

struct Checkpoint::RandomWeights {
  enum class Kind : uint8_t { kWeight, kOnes, kScale, kSmall };

  RandomWeightsSpec spec;
  std::mutex mu;  // values
  std::map<std::pair<DType, Kind>, std::shared_ptr<RandomValues>> values;

  static bool ends_with(std::string_view s, std::string_view end) {
    return s.size() >= end.size() && s.substr(s.size() - end.size()) == end;
  }

  // The dtype and kind of values a checkpoint of the config holds in `name`.
  std::pair<DType, Kind> rule(std::string_view name) const {
    if (ends_with(name, ".weight_scale_inv")) return {DType::kF32, Kind::kScale};
    if (name.find("norm") != std::string_view::npos) return {DType::kBF16, Kind::kOnes};
    if (ends_with(name, "e_score_correction_bias")) return {DType::kF32, Kind::kSmall};
    if (ends_with(name, ".bias")) return {DType::kBF16, Kind::kSmall};
    if (spec.fp8_linears && name.starts_with("model.layers.") && ends_with(name, "_proj.weight"))
      return {DType::kF8E4M3, Kind::kWeight};
    return {DType::kBF16, Kind::kWeight};
  }

  bool has(std::string_view name) const {
    if (name.starts_with("model.layers." + std::to_string(spec.num_layers) + ".")) return false;  // MTP
    if (ends_with(name, ".mlp.experts.gate_up_proj") || ends_with(name, ".mlp.experts.down_proj"))
      return false;  // the per-expert layout
    if (ends_with(name, ".weight_scale_inv")) return spec.fp8_linears;
    if (ends_with(name, "e_score_correction_bias")) return spec.router_bias;
    if (name == "lm_head.weight") return !spec.tied_lm_head;
    return name == "model.embed_tokens.weight";
  }

  // Bytes of `kind` in `dtype` from a fixed seed: random values of a
  // weight's size (uniform in +-0.05; e4m3 codes up to 1.875, never NaN),
  // ones, scales of 0.05, or small values (+-0.01).
  static void fill(uint8_t* out, size_t bytes, DType dtype, Kind kind) {
    uint64_t state = 0x9e3779b97f4a7c15ull ^ (static_cast<uint64_t>(dtype) << 8) ^ static_cast<uint64_t>(kind);
    auto next = [&state] {  // splitmix64
      uint64_t z = (state += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      return z ^ (z >> 31);
    };
    const float spread = kind == Kind::kSmall ? 0.02f : 0.1f;
    auto value = [&]() -> float {
      if (kind == Kind::kOnes) return 1.0f;
      if (kind == Kind::kScale) return 0.05f;
      return (static_cast<float>(next() >> 40) / 16777216.0f - 0.5f) * spread;
    };
    const size_t elem = dtype_size(dtype), n = bytes / elem;
    for (size_t i = 0; i < n; ++i) {
      if (dtype == DType::kF8E4M3) {
        // The top exponent bit cleared: |value| <= 1.875, never NaN.
        out[i] = kind == Kind::kWeight ? static_cast<uint8_t>(next() & 0xB7u) : 0x38;  // 0x38: 1.0
      } else if (dtype == DType::kBF16 || dtype == DType::kF16) {
        const uint16_t v = dtype == DType::kBF16 ? f32_to_bf16(value()) : f32_to_f16(value());
        std::memcpy(out + i * 2, &v, 2);
      } else {
        const float v = value();
        std::memcpy(out + i * 4, &v, 4);
      }
    }
  }

  Tensor get(std::string_view name, const Shape& shape) {
    const auto [dtype, kind] = rule(name);
    const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
    // FNV-1a of the name picks where in the period the tensor starts.
    uint64_t h = 0xcbf29ce484222325ull;
    for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
    const size_t offset = kind == Kind::kWeight || kind == Kind::kSmall ? (h % (RandomValues::kPeriod / 64)) * 64 : 0;
    std::shared_ptr<RandomValues> source;
    {
      std::lock_guard<std::mutex> lock(mu);
      std::shared_ptr<RandomValues>& v = values[{dtype, kind}];
      if (!v)
        v = std::make_shared<RandomValues>([dtype, kind](uint8_t* out, size_t n) { fill(out, n, dtype, kind); });
      source = v;
    }
    auto [data, owner] = RandomValues::view(source, offset, bytes);
    return Tensor::wrap(const_cast<uint8_t*>(data), shape, dtype, std::move(owner), Device::kCpu);
  }
};

Checkpoint Checkpoint::random(const RandomWeightsSpec& spec, const std::string& label) {
  Checkpoint checkpoint;
  checkpoint.dir_ = label;
  checkpoint.random_ = std::make_shared<RandomWeights>();
  checkpoint.random_->spec = spec;
  return checkpoint;
}

Checkpoint Checkpoint::open(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    fail("{}: {}", dir, fs::exists(dir, error) ? "not a directory" : "does not exist");
  }

  Checkpoint checkpoint;
  checkpoint.dir_ = dir;
  std::map<std::string, std::string> shard_of;  // from the index, when there is one
  std::vector<std::string> file_names;
  const std::string index_path = join(dir, kIndexFile);
  if (fs::exists(index_path, error)) {
    shard_of = parse_index(index_path);
    std::set<std::string> shards;
    for (const auto& [name, shard] : shard_of) {
      if (shards.insert(shard).second && !is_regular_file(join(dir, shard))) {
        fail("{}: tensor '{}': shard file {} does not exist", index_path, printable_name(name),
             join(dir, shard));
      }
    }
    file_names.assign(shards.begin(), shards.end());
  } else if (is_regular_file(join(dir, kSingleFile))) {
    file_names.emplace_back(kSingleFile);
  } else {
    for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
      const fs::path& path = it->path();
      if (path.extension() == ".safetensors" && is_regular_file(path.string())) {
        file_names.push_back(path.filename().string());
      }
    }
    if (error) fail("{}: cannot list: {}", dir, error.message());
    std::sort(file_names.begin(), file_names.end());
    if (file_names.empty()) {
      fail("{}: no {}, {} or *.safetensors files found", dir, kIndexFile, kSingleFile);
    }
  }

  for (const std::string& file_name : file_names) {
    checkpoint.files_.push_back(SafetensorsFile::open(join(dir, file_name)));
    const SafetensorsFile& file = checkpoint.files_.back();
    for (const auto& [name, entry] : file.tensors()) {
      const auto [it, inserted] =
          checkpoint.file_index_.emplace(name, checkpoint.files_.size() - 1);
      if (!inserted) {
        fail("{}: tensor '{}': also in {}; the checkpoint is ambiguous", file.path(),
             printable_name(name), checkpoint.files_[it->second].path());
      }
      checkpoint.total_bytes_ += entry.nbytes();
    }
  }

  // The index must agree with the shards: a tensor it lists elsewhere, or not
  // at all, means a partial download or mixed-up shards.
  for (const auto& [name, shard] : shard_of) {
    const std::string shard_path = join(dir, shard);
    const auto it = checkpoint.file_index_.find(name);
    if (it == checkpoint.file_index_.end()) {
      fail("{}: tensor '{}': listed in {} but missing from the shard", shard_path,
           printable_name(name), kIndexFile);
    }
    if (checkpoint.files_[it->second].path() != shard_path) {
      fail("{}: tensor '{}': {} places it in {}", checkpoint.files_[it->second].path(),
           printable_name(name), kIndexFile, shard_path);
    }
  }
  if (checkpoint.file_index_.empty()) fail("{}: the checkpoint holds no tensors", dir);
  return checkpoint;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> names;
  names.reserve(file_index_.size());
  for (const auto& item : file_index_) names.push_back(item.first);
  return names;
}

bool Checkpoint::has(std::string_view name) const {
  return random_ ? random_->has(name) : file_index_.contains(name);
}

std::vector<std::string> Checkpoint::files() const {
  std::vector<std::string> paths;
  for (const SafetensorsFile& file : files_) paths.push_back(file.path());
  return paths;
}

const SafetensorsFile& Checkpoint::file_of(std::string_view name) const {
  const auto it = file_index_.find(name);
  if (it == file_index_.end()) {
    fail("{}: tensor '{}' not found in checkpoint", dir_, printable_name(name));
  }
  {
    std::lock_guard<std::mutex> lock(used_->mu);
    used_->read.insert(it->first);
  }
  return files_[it->second];
}

std::vector<std::string> Checkpoint::unused() const {
  std::lock_guard<std::mutex> lock(used_->mu);
  std::vector<std::string> names;
  for (const auto& item : file_index_)
    if (!used_->read.contains(item.first)) names.push_back(item.first);
  return names;
}

void Checkpoint::require(std::string_view name) const {
  if (!random_) file_of(name);
}

CheckpointTensorInfo Checkpoint::info(std::string_view name) const {
  if (random_) return CheckpointTensorInfo{random_->rule(name).first, {}, "random weights for " + dir_, 0};
  const SafetensorsFile& file = file_of(name);
  const SafetensorsEntry& entry = *file.find(name);
  return CheckpointTensorInfo{entry.dtype, entry.shape, file.path(), entry.nbytes()};
}

Tensor Checkpoint::get(std::string_view name) const {
  BASALT_CHECK(!random_, "random weights for {}: tensor '{}' was asked for without its shape", dir_, name);
  return file_of(name).tensor(name);
}

Tensor Checkpoint::get(std::string_view name, const Shape& expected_shape) const {
  if (random_) return random_->get(name, expected_shape);
  const SafetensorsFile& file = file_of(name);
  const SafetensorsEntry& entry = *file.find(name);
  if (entry.shape != expected_shape) {
    fail("{}: tensor '{}': shape {} does not match the config's {}", file.path(),
         printable_name(name), shape_string(entry.shape), shape_string(expected_shape));
  }
  return file.tensor(name);
}

std::optional<Tensor> Checkpoint::find(std::string_view name) const {
  if (!has(name) || random_) return std::nullopt;
  return get(name);
}

void Checkpoint::prefetch(const ProgressFn& progress) const {
  // Chunks big enough for efficient readahead, small enough for a smooth
  // progress line.
  constexpr uint64_t kChunkBytes = 64ull << 20;
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t done = 0;
  if (progress) progress(0, total_bytes_);

  for (const SafetensorsFile& file : files_) {
    // Byte ranges that hold tensor data, merged where adjacent; validation
    // guarantees they do not overlap, so their lengths sum to the tensor bytes.
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const auto& item : file.tensors()) {
      if (item.second.nbytes() > 0) ranges.emplace_back(item.second.begin, item.second.end);
    }
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<uint64_t, uint64_t>> merged;
    for (const auto& range : ranges) {
      if (!merged.empty() && merged.back().second == range.first) {
        merged.back().second = range.second;
      } else {
        merged.push_back(range);
      }
    }

    const uint8_t* data = file.data().data();
    // The data section starts `phase` bytes into a page (the mapping itself
    // starts on a page boundary, which also makes the rounded-down madvise
    // start below stay inside the mapping).
    const uint64_t phase = reinterpret_cast<uintptr_t>(data) % page;
    auto advise = [&](uint64_t begin, uint64_t end) {
      const uint64_t aligned_begin = (begin + phase) / page * page;  // relative to the page of data
      ::madvise(const_cast<uint8_t*>(data - phase + aligned_begin), end + phase - aligned_begin,
                MADV_WILLNEED);
    };
    for (const auto& [begin, end] : merged) {
      for (uint64_t chunk = begin; chunk < end; chunk += kChunkBytes) {
        const uint64_t chunk_end = std::min(end, chunk + kChunkBytes);
        // Advise this chunk and the next, so the disk reads ahead while the
        // loop below waits on the current one. The advice is only a hint:
        // its failure changes nothing but speed.
        advise(chunk, std::min(end, chunk_end + kChunkBytes));
        // One byte from every page the chunk touches, the first possibly partial.
        const volatile uint8_t* bytes = data;
        uint8_t sink = 0;
        for (uint64_t offset = chunk; offset < chunk_end;
             offset = ((offset + phase) / page + 1) * page - phase) {
          sink ^= bytes[offset];
        }
        static_cast<void>(sink);
        done += chunk_end - chunk;
        if (progress) progress(done, total_bytes_);
      }
    }
  }
}

ProgressPrinter::ProgressPrinter() : ProgressPrinter(stderr, ::isatty(::fileno(stderr)) == 1) {}

ProgressPrinter::ProgressPrinter(std::FILE* out, bool out_is_terminal, std::string label)
    : out_(out), enabled_(out_is_terminal), label_(std::move(label)) {}

void ProgressPrinter::operator()(uint64_t done, uint64_t total) {
  if (!enabled_ || total < kMinTotalBytes) return;
  const bool finished = done >= total;
  if (finished && finished_) return;  // that line is already complete
  finished_ = finished;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && !finished && now - last_draw_ < kInterval) return;
  last_draw_ = now;
  const double gb = 1e9;
  std::fprintf(out_, "\r%s: %d%% (%.1f/%.1f GB)%s", label_.c_str(),
               static_cast<int>(static_cast<double>(done) * 100.0 / static_cast<double>(total)),
               static_cast<double>(done) / gb, static_cast<double>(total) / gb,
               finished ? "\n" : "");
  std::fflush(out_);
  drawn_ = !finished;  // the next load starts a fresh line
}

}  // namespace basalt

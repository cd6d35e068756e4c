#include "model/checkpoint.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <system_error>

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

bool Checkpoint::has(std::string_view name) const { return file_index_.contains(name); }

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

void Checkpoint::require(std::string_view name) const { file_of(name); }

CheckpointTensorInfo Checkpoint::info(std::string_view name) const {
  const SafetensorsFile& file = file_of(name);
  const SafetensorsEntry& entry = *file.find(name);
  return CheckpointTensorInfo{entry.dtype, entry.shape, file.path(), entry.nbytes()};
}

Tensor Checkpoint::get(std::string_view name) const { return file_of(name).tensor(name); }

Tensor Checkpoint::get(std::string_view name, const Shape& expected_shape) const {
  const SafetensorsFile& file = file_of(name);
  const SafetensorsEntry& entry = *file.find(name);
  if (entry.shape != expected_shape) {
    fail("{}: tensor '{}': shape {} does not match the config's {}", file.path(),
         printable_name(name), shape_string(entry.shape), shape_string(expected_shape));
  }
  return file.tensor(name);
}

std::optional<Tensor> Checkpoint::find(std::string_view name) const {
  if (!has(name)) return std::nullopt;
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

#include "model/quantize.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace basalt {
namespace fs = std::filesystem;

namespace {

int64_t blocks(int64_t n) { return (n + kFp8QuantBlock - 1) / kFp8QuantBlock; }

// Converts elements [begin, begin + n) of a host f32/bf16/f16 tensor to f32.
void load_f32(const Tensor& t, int64_t begin, int64_t n, float* out) {
  switch (t.dtype()) {
    case DType::kF32:
      std::memcpy(out, t.data<float>() + begin, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kBF16: {
      const uint16_t* in = static_cast<const uint16_t*>(t.raw()) + begin;
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* in = static_cast<const uint16_t*>(t.raw()) + begin;
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(in[i]);
      return;
    }
    default:
      fail("cannot quantize a tensor of dtype {} (f32, bf16 or f16 only)", dtype_name(t.dtype()));
  }
}

void check_weight(const Tensor& w) {
  BASALT_CHECK(w.device() == Device::kCpu && w.defined(), "quantize: weight must be a host tensor");
  BASALT_CHECK(w.rank() == 2, "quantize: weight must be 2-D, got {}", w.describe());
  BASALT_CHECK(w.dtype() == DType::kF32 || w.dtype() == DType::kBF16 || w.dtype() == DType::kF16,
               "quantize: weight dtype {} is not f32, bf16 or f16", dtype_name(w.dtype()));
}

// Block rows are independent: one unit of parallel work each.
void for_block_rows(int64_t rows, const std::function<void(int64_t)>& fn) {
  ThreadPool::global().parallel_for(blocks(rows), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) fn(b);
  });
}

std::string safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
  }
  fail("unknown dtype");
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void write_text(const fs::path& path, const std::string& text) {
  const fs::path partial = path.string() + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    BASALT_CHECK(out.good(), "{}: cannot create", partial.string());
    out << text;
    out.close();
    BASALT_CHECK(!out.fail(), "{}: write failed", partial.string());
  }
  std::error_code error;
  fs::rename(partial, path, error);
  BASALT_CHECK(!error, "{}: cannot rename from {}: {}", path.string(), partial.string(), error.message());
}

// Files of a model directory besides config.json and the weights that a
// quantized copy needs: tokenizer, generation defaults, chat template.
bool is_companion_file(const fs::path& path) {
  static const std::array<std::string_view, 10> kNames = {
      "generation_config.json", "tokenizer.json",     "tokenizer_config.json",
      "special_tokens_map.json", "tokenizer.model",   "vocab.json",
      "merges.txt",              "added_tokens.json", "chat_template.json",
      "chat_template.jinja"};
  const std::string name = path.filename().string();
  if (std::find(kNames.begin(), kNames.end(), name) != kNames.end()) return true;
  // Remote code that config.json's auto_map refers to.
  return path.extension() == ".py";
}

// One tensor of an output shard.
struct OutEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t nbytes = 0;
  enum Kind { kCopy, kFp8Weight, kScale } kind = kCopy;
  std::string source;  // the input tensor (for kScale: the weight it scales)
};

class ShardWriter {
 public:
  explicit ShardWriter(const fs::path& path) : path_(path), partial_(path.string() + ".partial") {
    out_ = std::fopen(partial_.c_str(), "wb");
    BASALT_CHECK(out_ != nullptr, "{}: cannot create: {}", partial_, std::strerror(errno));
  }
  ~ShardWriter() {
    if (out_ != nullptr) {
      std::fclose(out_);
      std::remove(partial_.c_str());
    }
  }
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  void write(const void* data, size_t n) {
    if (n == 0) return;
    BASALT_CHECK(std::fwrite(data, 1, n, out_) == n, "{}: write failed: {}", partial_,
                 std::strerror(errno));
  }

  void commit() {
    const int status = std::fclose(out_);
    out_ = nullptr;
    if (status != 0) {
      std::remove(partial_.c_str());
      fail("{}: write failed: {}", partial_, std::strerror(errno));
    }
    std::error_code error;
    fs::rename(partial_, path_, error);
    if (error) {
      std::remove(partial_.c_str());
      fail("{}: cannot rename from {}: {}", path_.string(), partial_, error.message());
    }
  }

 private:
  fs::path path_;
  std::string partial_;
  std::FILE* out_ = nullptr;
};

std::string shape_json(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace

Tensor fp8_block_scales(const Tensor& weight, std::string_view label) {
  check_weight(weight);
  const int64_t rows = weight.dim(0), cols = weight.dim(1), bc = blocks(cols);
  Tensor scales = Tensor::empty({blocks(rows), bc}, DType::kF32);
  float* s = scales.data<float>();
  for_block_rows(rows, [&](int64_t br) {
    std::vector<float> row(static_cast<size_t>(cols));
    std::vector<float> amax(static_cast<size_t>(bc), 0.0f);
    const int64_t end = std::min(rows, (br + 1) * kFp8QuantBlock);
    for (int64_t r = br * kFp8QuantBlock; r < end; ++r) {
      load_f32(weight, r * cols, cols, row.data());
      for (int64_t c = 0; c < cols; ++c) {
        const float v = row[static_cast<size_t>(c)];
        BASALT_CHECK(std::isfinite(v), "{}: element [{}, {}] is {}; only finite weights can be quantized",
                     label, r, c, v);
        float& m = amax[static_cast<size_t>(c / kFp8QuantBlock)];
        m = std::max(m, std::fabs(v));
      }
    }
    for (int64_t b = 0; b < bc; ++b) {
      const float m = amax[static_cast<size_t>(b)];
      s[br * bc + b] = m > 0.0f ? m / kFp8E4M3Max : 1.0f;
    }
  });
  return scales;
}

Tensor fp8_block_quantize(const Tensor& weight, const Tensor& scale_inv) {
  check_weight(weight);
  const int64_t rows = weight.dim(0), cols = weight.dim(1), bc = blocks(cols);
  BASALT_CHECK(scale_inv.dtype() == DType::kF32 && scale_inv.device() == Device::kCpu &&
                   scale_inv.shape() == Shape({blocks(rows), bc}),
               "quantize: scales {} do not fit weight {}", scale_inv.describe(), weight.describe());
  Tensor out = Tensor::empty({rows, cols}, DType::kF8E4M3);
  uint8_t* q = static_cast<uint8_t*>(out.raw());
  const float* s = scale_inv.data<float>();
  for_block_rows(rows, [&](int64_t br) {
    std::vector<float> row(static_cast<size_t>(cols));
    const int64_t end = std::min(rows, (br + 1) * kFp8QuantBlock);
    for (int64_t r = br * kFp8QuantBlock; r < end; ++r) {
      load_f32(weight, r * cols, cols, row.data());
      for (int64_t c = 0; c < cols; ++c)
        q[r * cols + c] = f32_to_fp8e4m3(row[static_cast<size_t>(c)] / s[br * bc + c / kFp8QuantBlock]);
    }
  });
  return out;
}

Fp8BlockWeight quantize_fp8_block(const Tensor& weight) {
  Fp8BlockWeight w;
  w.scale_inv = fp8_block_scales(weight);
  w.weight = fp8_block_quantize(weight, w.scale_inv);
  return w;
}

Tensor dequantize_fp8_block(const Tensor& weight, const Tensor& scale_inv) {
  BASALT_CHECK(weight.dtype() == DType::kF8E4M3 && weight.rank() == 2 &&
                   weight.device() == Device::kCpu,
               "dequantize: weight must be a host 2-D f8_e4m3 tensor, got {}", weight.describe());
  const int64_t rows = weight.dim(0), cols = weight.dim(1), bc = blocks(cols);
  BASALT_CHECK(scale_inv.dtype() == DType::kF32 && scale_inv.shape() == Shape({blocks(rows), bc}),
               "dequantize: scales {} do not fit weight {}", scale_inv.describe(), weight.describe());
  Tensor out = Tensor::empty({rows, cols}, DType::kF32);
  const uint8_t* q = static_cast<const uint8_t*>(weight.raw());
  const float* s = scale_inv.data<float>();
  float* o = out.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      o[r * cols + c] = fp8e4m3_to_f32(q[r * cols + c]) *
                        s[(r / kFp8QuantBlock) * bc + c / kFp8QuantBlock];
  return out;
}

bool is_fp8_block_linear(std::string_view name, const Shape& shape) {
  constexpr std::string_view kPrefix = "model.layers.", kSuffix = ".weight";
  if (shape.size() != 2 || name.substr(0, kPrefix.size()) != kPrefix || !ends_with(name, kSuffix))
    return false;
  size_t i = kPrefix.size();
  const size_t digits = i;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  if (i == digits || i >= name.size() || name[i] != '.') return false;
  const std::string_view module = name.substr(0, name.size() - kSuffix.size());
  const std::string_view leaf = module.substr(module.rfind('.') + 1);
  static constexpr std::array<std::string_view, 9> kLinears = {
      "q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj",
      "o_proj", "gate_proj", "up_proj", "down_proj"};
  return std::find(kLinears.begin(), kLinears.end(), leaf) != kLinears.end();
}

QuantizeReport quantize_checkpoint_fp8(const std::string& in_dir, const std::string& out_dir,
                                       const QuantizeOptions& options,
                                       const QuantizeProgress& progress) {
  BASALT_CHECK(fs::is_directory(in_dir), "{}: not a model directory", in_dir);
  const fs::path config_path = fs::path(in_dir) / "config.json";
  BASALT_CHECK(fs::is_regular_file(config_path), "{}: no config.json in model directory", in_dir);
  nlohmann::ordered_json config_json;
  {
    std::ifstream in(config_path);
    config_json = nlohmann::ordered_json::parse(in, nullptr, /*allow_exceptions=*/false);
    BASALT_CHECK(config_json.is_object(), "{}: not a JSON object", config_path.string());
  }
  BASALT_CHECK(!config_json.contains("quantization_config"),
               "{}: the checkpoint is already quantized (config.json has a quantization_config)",
               in_dir);
  const ModelConfig config = ModelConfig::load(in_dir);
  BASALT_CHECK(config.architecture == Architecture::kDeepseekV2 ||
                   config.architecture == Architecture::kDeepseekV3,
               "{}: model_type '{}': block-FP8 quantization is supported for DeepSeek-V2/V3 "
               "checkpoints only (the dense model loader reads f32, bf16 and f16 weights)",
               in_dir, config.model_type);

  const Checkpoint ckpt = Checkpoint::open(in_dir);
  const std::vector<std::string> names = ckpt.names();
  for (const std::string& name : names) {
    const CheckpointTensorInfo info = ckpt.info(name);
    BASALT_CHECK(info.dtype != DType::kF8E4M3 && !ends_with(name, "_scale_inv"),
                 "{}: tensor '{}' is {}: the checkpoint is already quantized", info.file, name,
                 info.dtype == DType::kF8E4M3 ? "float8_e4m3fn" : "a quantization scale");
    if (is_fp8_block_linear(name, info.shape)) {
      BASALT_CHECK(info.dtype == DType::kF32 || info.dtype == DType::kBF16 || info.dtype == DType::kF16,
                   "{}: tensor '{}' has dtype {}; weights to quantize must be f32, bf16 or f16",
                   info.file, name, dtype_name(info.dtype));
    }
  }

  // The output directory: new, or empty, or (with force) cleared of weights.
  std::error_code error;
  BASALT_CHECK(!fs::exists(out_dir) || !fs::equivalent(in_dir, out_dir, error),
               "{}: the output directory must differ from the input", out_dir);
  if (fs::exists(out_dir)) {
    BASALT_CHECK(fs::is_directory(out_dir), "{}: exists and is not a directory", out_dir);
    if (!fs::is_empty(out_dir)) {
      BASALT_CHECK(options.force, "{}: output directory is not empty (use --force to write into it)",
                   out_dir);
      for (const fs::directory_entry& e : fs::directory_iterator(out_dir)) {
        const std::string file = e.path().filename().string();
        if (e.is_regular_file() && (ends_with(file, ".safetensors") || ends_with(file, ".partial") ||
                                    file == "model.safetensors.index.json"))
          fs::remove(e.path());
      }
    }
  } else {
    fs::create_directories(out_dir, error);
    BASALT_CHECK(!error, "{}: cannot create directory: {}", out_dir, error.message());
  }

  // Tensors by input file, files in the order the checkpoint opened them.
  const std::vector<std::string> files = ckpt.files();
  std::map<std::string, std::vector<std::string>> by_file;
  for (const std::string& name : names) by_file[ckpt.info(name).file].push_back(name);

  QuantizeReport report;
  report.bytes_before = ckpt.total_bytes();
  std::map<std::string, std::string> weight_map;
  uint64_t done = 0;
  if (progress) progress(0, report.bytes_before);
  for (const std::string& file : files) {
    const auto it = by_file.find(file);
    if (it == by_file.end()) continue;
    const std::string shard = fs::path(file).filename().string();
    const fs::path out_path = fs::path(out_dir) / shard;

    std::vector<OutEntry> entries;
    std::map<std::string, Tensor> scales;
    for (const std::string& name : it->second) {
      const CheckpointTensorInfo info = ckpt.info(name);
      if (!is_fp8_block_linear(name, info.shape)) {
        entries.push_back({name, info.dtype, info.shape, info.nbytes, OutEntry::kCopy, name});
        continue;
      }
      const std::string scale_name = name + "_scale_inv";
      BASALT_CHECK(!ckpt.has(scale_name), "{}: tensor '{}' already exists", info.file, scale_name);
      Tensor scale = fp8_block_scales(ckpt.get(name), fmt::format("{}: tensor '{}'", info.file, name));
      const uint64_t numel = static_cast<uint64_t>(shape_numel(info.shape));
      entries.push_back({name, DType::kF8E4M3, info.shape, numel, OutEntry::kFp8Weight, name});
      entries.push_back({scale_name, DType::kF32, scale.shape(), scale.nbytes(), OutEntry::kScale, name});
      scales.emplace(name, std::move(scale));
    }
    // Larger elements first, as the reference writer orders them: each
    // tensor then sits at a multiple of its element size, with no gaps.
    std::sort(entries.begin(), entries.end(), [](const OutEntry& a, const OutEntry& b) {
      const size_t sa = dtype_size(a.dtype), sb = dtype_size(b.dtype);
      return sa != sb ? sa > sb : a.name < b.name;
    });

    std::map<std::string, std::string> metadata = SafetensorsFile::open(file).metadata();
    if (metadata.empty()) metadata["format"] = "pt";
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = meta;
    std::string header_text = header.dump();
    header_text.pop_back();  // reopen the object to append the tensors in file order
    uint64_t offset = 0;
    for (const OutEntry& e : entries) {
      header_text += fmt::format(",{}:{{\"dtype\":\"{}\",\"shape\":{},\"data_offsets\":[{},{}]}}",
                                 nlohmann::json(e.name).dump(), safetensors_dtype(e.dtype),
                                 shape_json(e.shape), offset, offset + e.nbytes);
      offset += e.nbytes;
      weight_map[e.name] = shard;
    }
    header_text += '}';
    header_text.append((8 - header_text.size() % 8) % 8, ' ');

    ShardWriter writer(out_path);
    std::array<uint8_t, 8> prefix;
    for (int i = 0; i < 8; ++i) prefix[i] = static_cast<uint8_t>(header_text.size() >> (8 * i));
    writer.write(prefix.data(), prefix.size());
    writer.write(header_text.data(), header_text.size());
    for (const OutEntry& e : entries) {
      switch (e.kind) {
        case OutEntry::kCopy: {
          const Tensor t = ckpt.get(e.source);
          writer.write(t.raw(), t.nbytes());
          ++report.tensors_copied;
          break;
        }
        case OutEntry::kScale: {
          const Tensor& s = scales.at(e.source);
          writer.write(s.raw(), s.nbytes());
          break;
        }
        case OutEntry::kFp8Weight: {
          const Tensor q = fp8_block_quantize(ckpt.get(e.source), scales.at(e.source));
          writer.write(q.raw(), q.nbytes());
          ++report.tensors_quantized;
          break;
        }
      }
      if (e.kind != OutEntry::kScale) {
        done += ckpt.info(e.source).nbytes;
        if (progress) progress(done, report.bytes_before);
      }
      report.bytes_after += e.nbytes;
    }
    writer.commit();
    // Read the shard back through the validating parser.
    SafetensorsFile::open(out_path.string());
    report.files.push_back(out_path.string());
  }

  if (fs::exists(fs::path(in_dir) / "model.safetensors.index.json") || report.files.size() > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", report.bytes_after}};
    nlohmann::ordered_json map = nlohmann::ordered_json::object();
    for (const auto& [name, shard] : weight_map) map[name] = shard;
    index["weight_map"] = std::move(map);
    write_text(fs::path(out_dir) / "model.safetensors.index.json", index.dump(2) + "\n");
  }

  for (const fs::directory_entry& e : fs::directory_iterator(in_dir)) {
    if (!e.is_regular_file() || !is_companion_file(e.path())) continue;
    fs::copy_file(e.path(), fs::path(out_dir) / e.path().filename(),
                  fs::copy_options::overwrite_existing, error);
    BASALT_CHECK(!error, "{}: cannot copy to {}: {}", e.path().string(), out_dir, error.message());
  }
  // config.json last: a directory left by an interrupted run does not load.
  nlohmann::ordered_json quant;
  quant["activation_scheme"] = "dynamic";
  quant["fmt"] = "e4m3";
  quant["quant_method"] = "fp8";
  quant["weight_block_size"] = {kFp8QuantBlock, kFp8QuantBlock};
  config_json["quantization_config"] = std::move(quant);
  write_text(fs::path(out_dir) / "config.json", config_json.dump(2) + "\n");
  return report;
}

}  // namespace basalt

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
#include "core/int_weights.h"
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
  enum Kind { kCopy, kFp8Weight, kScale, kIntCodes, kIntScales } kind = kCopy;
  std::string source;  // the input tensor (for kScale and kIntScales: the weight it scales)
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

// A weight's codes and scales in an integer format.
struct IntQuantized {
  Tensor codes, scales;
};

IntQuantized quantize_int_tensor(const Tensor& w, const IntWeightLayout& l, std::string_view label) {
  check_weight(w);
  const int64_t rows = w.dim(0), cols = w.dim(1);
  IntQuantized q{Tensor::empty({rows, l.code_columns()}, l.bits == 8 ? DType::kI8 : DType::kU8),
                 Tensor::empty({rows, l.scale_columns()}, DType::kF16)};
  ThreadPool::global().parallel_for(rows, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      load_f32(w, r * cols, cols, row.data());
      try {
        quantize_int_row(l, row.data(), q.codes.data<uint8_t>() + r * l.code_columns(),
                         q.scales.data<uint16_t>() + r * l.scale_columns());
      } catch (const Error& e) {
        fail("{}: row {}: {}", label, r, e.what());
      }
    }
  });
  return q;
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

bool is_int_linear(std::string_view name, const Shape& shape, const ModelConfig& config) {
  const bool deepseek =
      config.architecture == Architecture::kDeepseekV2 || config.architecture == Architecture::kDeepseekV3;
  if (name == "lm_head.weight") return !deepseek && shape.size() == 2;
  // Dense attention's k and v (DeepSeek's MLA has neither).
  if (name.starts_with("model.layers.") && shape.size() == 2 &&
      (ends_with(name, ".self_attn.k_proj.weight") || ends_with(name, ".self_attn.v_proj.weight")))
    return true;
  if (!is_fp8_block_linear(name, shape)) return false;
  return !(deepseek && ends_with(name, ".kv_b_proj.weight"));
}

LinearWeight read_int_linear(const Checkpoint& ckpt, const std::string& name, int64_t n, int64_t k,
                             const ModelConfig& config) {
  const IntWeightsConfig& f = config.int_weights;
  BASALT_CHECK(f.bits != 0, "{}: tensor '{}': config.json names no integer format", ckpt.dir(), name);
  LinearWeight w;
  w.int_layout = IntWeightLayout{f.bits, f.group_for(k), k};
  const IntWeightLayout& l = w.int_layout;
  const std::string layout_error = int_layout_error(l);
  BASALT_CHECK(layout_error.empty(), "{}: tensor '{}': {}", ckpt.dir(), name, layout_error);
  const DType code_dtype = f.bits == 8 ? DType::kI8 : DType::kU8;
  w.weight = ckpt.get(name, {n, l.code_columns()});
  BASALT_CHECK(w.weight.dtype() == code_dtype, "{}: tensor '{}' has dtype {}; int{} codes are {}",
               ckpt.info(name).file, name, dtype_name(w.weight.dtype()), f.bits, dtype_name(code_dtype));
  const std::string scale_name = name + "_scale";
  BASALT_CHECK(ckpt.has(scale_name), "{}: tensor '{}' has no scales '{}'", ckpt.info(name).file, name, scale_name);
  w.scales = ckpt.get(scale_name, {n, l.scale_columns()});
  BASALT_CHECK(w.scales.dtype() == DType::kF16, "{}: tensor '{}' has dtype {}; scales are f16",
               ckpt.info(scale_name).file, scale_name, dtype_name(w.scales.dtype()));
  return w;
}

QuantizeReport quantize_checkpoint(const std::string& in_dir, const std::string& out_dir,
                                   const QuantizeOptions& options, const QuantizeProgress& progress) {
  const bool int_format = options.format != QuantFormat::kFp8Block;
  const int bits = options.format == QuantFormat::kInt4 ? 4 : 8;
  BASALT_CHECK(!int_format || options.group_size == -1 ||
                   (options.group_size >= kIntBlock && options.group_size % kIntBlock == 0),
               "the group size must be a multiple of {} or -1 (one scale per row), got {}", kIntBlock,
               options.group_size);
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
  const bool deepseek =
      config.architecture == Architecture::kDeepseekV2 || config.architecture == Architecture::kDeepseekV3;
  BASALT_CHECK(int_format || deepseek,
               "{}: model_type '{}': block-FP8 quantization is supported for DeepSeek-V2/V3 "
               "checkpoints only (the dense model loader reads f32, bf16 and f16 weights)",
               in_dir, config.model_type);

  const Checkpoint ckpt = Checkpoint::open(in_dir);
  const std::vector<std::string> names = ckpt.names();
  for (const std::string& name : names) {
    const CheckpointTensorInfo info = ckpt.info(name);
    const bool codes = info.dtype == DType::kF8E4M3 || info.dtype == DType::kI8 || info.dtype == DType::kU8;
    BASALT_CHECK(!codes && !ends_with(name, "_scale_inv") && !ends_with(name, ".weight_scale"),
                 "{}: tensor '{}' is {}: the checkpoint is already quantized", info.file, name,
                 !codes ? std::string("a quantization scale")
                 : info.dtype == DType::kF8E4M3 ? std::string("float8_e4m3fn")
                                                : std::string(dtype_name(info.dtype)) + " codes");
    if (int_format ? is_int_linear(name, info.shape, config) : is_fp8_block_linear(name, info.shape)) {
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

  // A dense model with tied embeddings gets an lm_head of its own: the
  // embedding stays in its dtype for the lookups, the head is quantized.
  const std::string embed_name = "model.embed_tokens.weight";
  const bool untie = int_format && !deepseek && config.tie_word_embeddings && !ckpt.has("lm_head.weight");
  BASALT_CHECK(!untie || ckpt.has(embed_name), "{}: no tensor '{}'", in_dir, embed_name);
  auto int_layout = [&](const Shape& shape) {
    return IntWeightLayout{bits, options.group_size < 0 ? shape[1] : options.group_size, shape[1]};
  };

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
    std::vector<std::string> tensors = it->second;
    if (untie && ckpt.info(embed_name).file == file) tensors.push_back("lm_head.weight");
    for (const std::string& name : tensors) {
      const std::string source = name == "lm_head.weight" && untie ? embed_name : name;
      const CheckpointTensorInfo info = ckpt.info(source);
      if (int_format && is_int_linear(name, info.shape, config)) {
        const IntWeightLayout l = int_layout(info.shape);
        const std::string scale_name = name + "_scale";
        BASALT_CHECK(!ckpt.has(scale_name), "{}: tensor '{}' already exists", info.file, scale_name);
        entries.push_back({name, bits == 8 ? DType::kI8 : DType::kU8, {info.shape[0], l.code_columns()},
                           static_cast<uint64_t>(info.shape[0] * l.code_columns()), OutEntry::kIntCodes, source});
        entries.push_back({scale_name, DType::kF16, {info.shape[0], l.scale_columns()},
                           static_cast<uint64_t>(info.shape[0] * l.scale_columns() * 2), OutEntry::kIntScales, source});
        continue;
      }
      if (int_format || !is_fp8_block_linear(name, info.shape)) {
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
                                 nlohmann::json(e.name).dump(), safetensors_dtype_name(e.dtype),
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
        case OutEntry::kIntCodes:
        case OutEntry::kIntScales: {
          // Codes and scales each from one pass over the weight: one
          // tensor's quantized image in memory at a time.
          const Tensor w = ckpt.get(e.source);
          const IntQuantized q = quantize_int_tensor(w, int_layout(w.shape()), e.source);
          const Tensor& part = e.kind == OutEntry::kIntCodes ? q.codes : q.scales;
          writer.write(part.raw(), part.nbytes());
          if (e.kind == OutEntry::kIntCodes) ++report.tensors_quantized;
          break;
        }
      }
      if (e.kind != OutEntry::kScale && e.kind != OutEntry::kIntScales) {
        done += ckpt.info(e.source).nbytes;
        if (progress) progress(std::min(done, report.bytes_before), report.bytes_before);
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
  if (int_format) {
    quant["quant_method"] = kIntQuantMethod;
    quant["bits"] = bits;
    quant["group_size"] = options.group_size;
    if (untie) config_json["tie_word_embeddings"] = false;
  } else {
    quant["activation_scheme"] = "dynamic";
    quant["fmt"] = "e4m3";
    quant["quant_method"] = "fp8";
    quant["weight_block_size"] = {kFp8QuantBlock, kFp8QuantBlock};
  }
  config_json["quantization_config"] = std::move(quant);
  write_text(fs::path(out_dir) / "config.json", config_json.dump(2) + "\n");
  return report;
}

}  // namespace basalt

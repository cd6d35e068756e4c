#include "model/safetensors.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>

#include "core/error.h"

namespace basalt {

// A read-only private mapping of a whole file; unmapped when the last owner
// (a SafetensorsFile or a Tensor viewing it) lets go.
class MappedFile {
 public:
  MappedFile(const void* addr, size_t size) : addr_(addr), size_(size) {}
  ~MappedFile() { ::munmap(const_cast<void*>(addr_), size_); }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {static_cast<const uint8_t*>(addr_), size_}; }

 private:
  const void* addr_;
  size_t size_;
};

namespace {

std::string errno_message(int error) { return std::generic_category().message(error); }

constexpr std::string_view kMetadataKey = "__metadata__";

// nlohmann's message without its "[json.exception.parse_error.101] " tag, made
// printable: it quotes the offending input, which may be long or binary.
std::string json_error_text(const std::exception& error) {
  std::string_view text = error.what();
  if (text.starts_with("[json.exception.")) {
    const size_t tag_end = text.find("] ");
    if (tag_end != std::string_view::npos) text.remove_prefix(tag_end + 2);
  }
  return printable_name(text);
}

// Builds the index straight from parser events instead of a JSON document, so
// memory stays proportional to what a valid header holds (the rank and
// offsets limits bound every array) and nesting never goes deeper than a
// valid header's. Each event that a valid header cannot contain at that point
// throws basalt::Error naming the tensor; nlohmann's parser unwinds cleanly
// through exceptions thrown from its handler.
class HeaderParser final : public nlohmann::json_sax<nlohmann::json> {
 public:
  HeaderParser(uint64_t data_size, const std::string& label)
      : data_size_(data_size), label_(label) {}

  SafetensorsHeader take() {
    if (state_ != State::kDone) fail("{}: header JSON ended early", label_);
    check_no_overlaps();
    return std::move(header_);
  }

  bool null() override {
    if (state_ == State::kRoot && in_metadata_key_) {  // "__metadata__": null means none
      clear_key();
      return true;
    }
    return unexpected("null");
  }
  bool boolean(bool) override { return unexpected("a boolean"); }
  bool number_integer(number_integer_t value) override {
    if (value < 0 && (state_ == State::kShape || state_ == State::kOffsets)) {
      fail_tensor("'{}' contains the negative value {}", field_name(), value);
    }
    return number_unsigned(static_cast<number_unsigned_t>(value));
  }
  bool number_unsigned(number_unsigned_t value) override {
    if (state_ == State::kShape) {
      if (entry_.shape.size() >= kSafetensorsMaxRank) {
        fail_tensor("'shape' has more than {} dimensions", kSafetensorsMaxRank);
      }
      if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail_tensor("'shape' dimension {} is too large", value);
      }
      entry_.shape.push_back(static_cast<int64_t>(value));
      return true;
    }
    if (state_ == State::kOffsets) {
      if (offsets_.size() >= 2) fail_tensor("'data_offsets' must have exactly 2 elements");
      offsets_.push_back(value);
      return true;
    }
    return unexpected("a number");
  }
  bool number_float(number_float_t, const string_t& text) override {
    if (state_ == State::kShape || state_ == State::kOffsets) {
      fail_tensor("'{}' must contain integers, got {}", field_name(), printable_name(text));
    }
    return unexpected("a number");
  }
  bool string(string_t& value) override {
    if (state_ == State::kEntry && field_ == Field::kDtype) {
      dtype_name_ = std::move(value);
      return true;
    }
    if (state_ == State::kMetadata) {
      header_.metadata[metadata_key_] = std::move(value);
      return true;
    }
    return unexpected("a string");
  }
  bool binary(binary_t&) override { return unexpected("binary data"); }

  bool start_object(std::size_t) override {
    if (state_ == State::kStart) {
      state_ = State::kRoot;
      return true;
    }
    if (state_ == State::kRoot) {  // JSON grammar puts a key before every value here
      if (in_metadata_key_) {
        state_ = State::kMetadata;
        return true;
      }
      state_ = State::kEntry;
      entry_ = SafetensorsEntry{};
      offsets_.clear();
      dtype_name_.reset();
      has_shape_ = false;
      has_offsets_field_ = false;
      field_ = Field::kNone;
      return true;
    }
    return unexpected("an object");
  }

  bool key(string_t& name) override {
    if (state_ == State::kRoot) {
      const bool is_metadata = name == kMetadataKey;
      if (is_metadata && seen_metadata_) fail("{}: __metadata__ appears twice", label_);
      if (!is_metadata && header_.tensors.contains(name)) {
        fail("{}: tensor '{}': listed twice in the header", label_, printable_name(name));
      }
      in_metadata_key_ = is_metadata;
      seen_metadata_ = seen_metadata_ || is_metadata;
      key_ = std::move(name);
      return true;
    }
    if (state_ == State::kEntry) {
      if (name == "dtype") {
        field_ = Field::kDtype;
        if (dtype_name_) fail_tensor("field 'dtype' appears twice");
      } else if (name == "shape") {
        field_ = Field::kShape;
        if (has_shape_) fail_tensor("field 'shape' appears twice");
      } else if (name == "data_offsets") {
        field_ = Field::kOffsets;
        if (has_offsets_field_) fail_tensor("field 'data_offsets' appears twice");
      } else {
        fail_tensor("unknown field '{}'", printable_name(name));
      }
      return true;
    }
    if (state_ == State::kMetadata) {
      if (header_.metadata.contains(name)) {
        fail("{}: __metadata__ key '{}' appears twice", label_, printable_name(name));
      }
      metadata_key_ = std::move(name);
      return true;
    }
    return unexpected("a key");
  }

  bool end_object() override {
    switch (state_) {
      case State::kRoot:
        state_ = State::kDone;
        return true;
      case State::kMetadata:
        state_ = State::kRoot;
        clear_key();
        return true;
      case State::kEntry:
        finish_entry();
        state_ = State::kRoot;
        clear_key();
        return true;
      default:
        return unexpected("the end of an object");
    }
  }

  bool start_array(std::size_t) override {
    if (state_ == State::kEntry && field_ == Field::kShape) {
      has_shape_ = true;
      state_ = State::kShape;
      return true;
    }
    if (state_ == State::kEntry && field_ == Field::kOffsets) {
      has_offsets_field_ = true;
      state_ = State::kOffsets;
      return true;
    }
    return unexpected("an array");
  }

  bool end_array() override {
    if (state_ == State::kShape || state_ == State::kOffsets) {
      if (state_ == State::kOffsets && offsets_.size() != 2) {
        fail_tensor("'data_offsets' must have exactly 2 elements, got {}", offsets_.size());
      }
      state_ = State::kEntry;
      field_ = Field::kNone;
      return true;
    }
    return unexpected("the end of an array");
  }

  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& error) override {
    fail("{}: header is not valid JSON (byte {}): {}", label_, position, json_error_text(error));
  }

 private:
  enum class State { kStart, kRoot, kEntry, kShape, kOffsets, kMetadata, kDone };
  enum class Field { kNone, kDtype, kShape, kOffsets };

  std::string_view field_name() const {
    switch (field_) {
      case Field::kDtype:
        return "dtype";
      case Field::kShape:
        return "shape";
      case Field::kOffsets:
        return "data_offsets";
      case Field::kNone:
        break;
    }
    return "?";
  }

  void clear_key() {
    key_.clear();
    in_metadata_key_ = false;
  }

  template <typename... Args>
  [[noreturn]] void fail_tensor(fmt::format_string<Args...> format, Args&&... args) const {
    fail("{}: tensor '{}': {}", label_, printable_name(key_),
         fmt::format(format, std::forward<Args>(args)...));
  }

  // Names what a valid header would have had where `what` appeared.
  [[noreturn]] bool unexpected(std::string_view what) const {
    switch (state_) {
      case State::kStart:
        fail("{}: header must be a JSON object, got {}", label_, what);
      case State::kRoot:
        if (in_metadata_key_) fail("{}: __metadata__ must be an object, got {}", label_, what);
        fail_tensor("entry must be an object, got {}", what);
      case State::kEntry:
        if (field_ == Field::kDtype) fail_tensor("'dtype' must be a string, got {}", what);
        fail_tensor("'{}' must be an array of integers, got {}", field_name(), what);
      case State::kShape:
      case State::kOffsets:
        fail_tensor("'{}' must contain integers, got {}", field_name(), what);
      case State::kMetadata:
        fail("{}: __metadata__ value for '{}' must be a string, got {}", label_,
             printable_name(metadata_key_), what);
      case State::kDone:
        break;
    }
    fail("{}: unexpected {} after the header object", label_, what);
  }

  void finish_entry() {
    if (!dtype_name_) fail_tensor("missing field 'dtype'");
    if (!has_shape_) fail_tensor("missing field 'shape'");
    if (!has_offsets_field_) fail_tensor("missing field 'data_offsets'");

    const std::optional<DType> dtype = dtype_from_safetensors(*dtype_name_);
    if (!dtype) {
      fail_tensor("unsupported dtype '{}' (supported: F32, BF16, F16, F8_E4M3, I32, I64)",
                  printable_name(*dtype_name_));
    }
    entry_.dtype = *dtype;

    uint64_t numel = 1;
    for (int64_t dim : entry_.shape) {
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dim), &numel) ||
          numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail_tensor("shape {} has too many elements", shape_string(entry_.shape));
      }
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(entry_.dtype)), &nbytes)) {
      fail_tensor("shape {} is too large in bytes", shape_string(entry_.shape));
    }

    entry_.begin = offsets_[0];
    entry_.end = offsets_[1];
    if (entry_.begin > entry_.end) {
      fail_tensor("data_offsets [{}, {}] begin after they end", entry_.begin, entry_.end);
    }
    if (entry_.end > data_size_) {
      fail_tensor(
          "data_offsets [{}, {}] extend past the end of the data section ({} bytes); "
          "the file is truncated or the offsets are wrong",
          entry_.begin, entry_.end, data_size_);
    }
    if (entry_.end - entry_.begin != nbytes) {
      fail_tensor("data_offsets [{}, {}] hold {} bytes but {} {} needs {}", entry_.begin,
                  entry_.end, entry_.end - entry_.begin, safetensors_dtype_name(entry_.dtype),
                  shape_string(entry_.shape), nbytes);
    }
    header_.tensors.emplace(std::move(key_), std::move(entry_));
  }

  void check_no_overlaps() const {
    std::vector<const SafetensorsIndex::value_type*> by_offset;
    by_offset.reserve(header_.tensors.size());
    for (const auto& item : header_.tensors) {
      if (item.second.nbytes() > 0) by_offset.push_back(&item);  // empty ranges hold no bytes
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](const auto* a, const auto* b) { return a->second.begin < b->second.begin; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const auto& [prev_name, prev] = *by_offset[i - 1];
      const auto& [name, entry] = *by_offset[i];
      if (entry.begin < prev.end) {
        fail("{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' at [{}, {}]", label_,
             printable_name(name), entry.begin, entry.end, printable_name(prev_name), prev.begin,
             prev.end);
      }
    }
  }

  const uint64_t data_size_;
  const std::string& label_;
  State state_ = State::kStart;
  SafetensorsHeader header_;

  std::string key_;  // the tensor (or "__metadata__") being read
  bool in_metadata_key_ = false;
  bool seen_metadata_ = false;
  std::string metadata_key_;

  Field field_ = Field::kNone;
  SafetensorsEntry entry_;
  std::optional<std::string> dtype_name_;
  bool has_shape_ = false;
  bool has_offsets_field_ = false;
  std::vector<uint64_t> offsets_;
};

uint64_t read_u64_le(const uint8_t* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

void append_u64_le(std::string& out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out += static_cast<char>((value >> (8 * i)) & 0xff);
}

std::string json_quoted(const std::string& text, std::string_view what) {
  try {
    return nlohmann::json(text).dump();
  } catch (const nlohmann::json::exception&) {
    fail("{} '{}' is not valid UTF-8", what, printable_name(text));
  }
}

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
  }
  fail("internal error: dtype {} has no safetensors name", static_cast<int>(dtype));
}

std::string printable_name(std::string_view name) {
  constexpr size_t kMaxShown = 200;
  const bool shortened = name.size() > kMaxShown;
  if (shortened) {
    size_t cut = kMaxShown;
    while (cut > 0 && (static_cast<uint8_t>(name[cut]) & 0xc0) == 0x80) --cut;  // whole UTF-8 chars
    name = name.substr(0, cut);
  }
  std::string out;
  out.reserve(name.size());
  for (char c : name) {
    const auto byte = static_cast<uint8_t>(c);
    if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  if (shortened) out += "...";
  return out;
}

SafetensorsHeader SafetensorsFile::parse_header(std::string_view header_json, uint64_t data_size,
                                                const std::string& label) {
  HeaderParser parser(data_size, label);
  try {
    nlohmann::json::sax_parse(header_json.begin(), header_json.end(), &parser);
  } catch (const nlohmann::json::exception& error) {
    // The parser reports syntax errors through parse_error(); this catches
    // anything else it might throw, so that only basalt::Error leaves here.
    fail("{}: header is not valid JSON: {}", label, json_error_text(error));
  }
  return parser.take();
}

SafetensorsView SafetensorsFile::parse_image(std::span<const uint8_t> image,
                                             const std::string& label) {
  if (image.size() < 8) {
    fail("{}: file is {} bytes, too short for a safetensors header (at least 8)", label,
         image.size());
  }
  const uint64_t header_size = read_u64_le(image.data());
  if (header_size == 0) fail("{}: header length is 0", label);
  if (header_size > kSafetensorsMaxHeaderBytes) {
    fail("{}: header length {} exceeds the limit of {} bytes; the file is not safetensors", label,
         header_size, kSafetensorsMaxHeaderBytes);
  }
  if (header_size > image.size() - 8) {
    fail(
        "{}: header length {} exceeds the {} bytes after the length field; the file is "
        "truncated or not safetensors",
        label, header_size, image.size() - 8);
  }
  const std::string_view header_json(reinterpret_cast<const char*>(image.data()) + 8,
                                     static_cast<size_t>(header_size));
  const std::span<const uint8_t> data = image.subspan(8 + static_cast<size_t>(header_size));
  return SafetensorsView{parse_header(header_json, data.size(), label), data};
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, errno_message(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path, errno_message(error));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path);
  }
  const auto size = static_cast<size_t>(info.st_size);
  if (size < 8) {
    ::close(fd);
    fail("{}: file is {} bytes, too short for a safetensors header (at least 8)", path, size);
  }
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_error = errno;
  ::close(fd);  // the mapping keeps the file open
  if (addr == MAP_FAILED) fail("{}: cannot map {} bytes: {}", path, size, errno_message(map_error));

  SafetensorsFile file;
  file.path_ = path;
  file.mapping_ = std::make_shared<const MappedFile>(addr, size);
  SafetensorsView view = parse_image(file.mapping_->bytes(), path);
  file.header_ = std::move(view.header);
  file.data_ = view.data;
  return file;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  const auto it = header_.tensors.find(name);
  return it == header_.tensors.end() ? nullptr : &it->second;
}

uint64_t SafetensorsFile::file_size() const { return mapping_ ? mapping_->bytes().size() : 0; }

Tensor SafetensorsFile::tensor(std::string_view name) const {
  const SafetensorsEntry* entry = find(name);
  if (!entry) fail("{}: tensor '{}' not found", path_, printable_name(name));
  const uint8_t* bytes = data_.data() + entry->begin;
  if (reinterpret_cast<uintptr_t>(bytes) % dtype_size(entry->dtype) == 0) {
    // Tensor's interface is mutable, but the mapping is read-only (see the header comment).
    return Tensor::wrap(const_cast<uint8_t*>(bytes), entry->shape, entry->dtype, mapping_);
  }
  Tensor copy = Tensor::empty(entry->shape, entry->dtype);
  if (entry->nbytes() > 0) std::memcpy(copy.raw(), bytes, entry->nbytes());
  return copy;
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Larger elements first: every tensor then starts at a multiple of its
  // element size, given a data section that starts at a multiple of 8.
  std::vector<const std::pair<std::string, Tensor>*> order;
  order.reserve(tensors.size());
  for (const auto& item : tensors) {
    const Tensor& tensor = item.second;
    if (item.first == kMetadataKey) fail("{}: tensor name '{}' is reserved", path, kMetadataKey);
    if (tensor.device() != Device::kCpu || !tensor.defined()) {
      fail("{}: tensor '{}': only defined host tensors can be written, got {}", path,
           printable_name(item.first), tensor.describe());
    }
    order.push_back(&item);
  }
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    const size_t size_a = dtype_size(a->second.dtype()), size_b = dtype_size(b->second.dtype());
    return size_a != size_b ? size_a > size_b : a->first < b->first;
  });
  std::vector<std::string_view> names;
  for (const auto* item : order) names.push_back(item->first);
  std::sort(names.begin(), names.end());
  const auto duplicate = std::adjacent_find(names.begin(), names.end());
  if (duplicate != names.end())
    fail("{}: tensor '{}': given twice", path, printable_name(*duplicate));

  std::string header = "{";
  if (!metadata.empty()) {
    header += fmt::format("\"{}\":{{", kMetadataKey);
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) header += ',';
      first = false;
      header += json_quoted(key, fmt::format("{}: metadata key", path));
      header += ':';
      header += json_quoted(value, fmt::format("{}: metadata value", path));
    }
    header += '}';
  }
  uint64_t offset = 0;
  for (const auto* item : order) {
    const Tensor& tensor = item->second;
    if (header.size() > 1) header += ',';
    header += json_quoted(item->first, fmt::format("{}: tensor name", path));
    header += fmt::format(R"(:{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})",
                          safetensors_dtype_name(tensor.dtype()), fmt::join(tensor.shape(), ","),
                          offset, offset + tensor.nbytes());
    offset += tensor.nbytes();
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');

  std::string prefix;
  append_u64_le(prefix, header.size());

  const std::string partial = path + ".partial";
  std::FILE* out = std::fopen(partial.c_str(), "wb");
  if (!out) fail("{}: cannot create: {}", partial, errno_message(errno));
  bool ok = std::fwrite(prefix.data(), 1, prefix.size(), out) == prefix.size() &&
            std::fwrite(header.data(), 1, header.size(), out) == header.size();
  for (const auto* item : order) {
    const Tensor& tensor = item->second;
    if (!ok) break;
    if (tensor.nbytes() > 0)
      ok = std::fwrite(tensor.raw(), 1, tensor.nbytes(), out) == tensor.nbytes();
  }
  const int write_error = errno;
  ok = (std::fclose(out) == 0) && ok;
  if (!ok) {
    std::remove(partial.c_str());
    fail("{}: write failed: {}", partial, errno_message(write_error));
  }
  std::error_code error;
  std::filesystem::rename(partial, path, error);
  if (error) {
    std::remove(partial.c_str());
    fail("{}: cannot rename from {}: {}", path, partial, error.message());
  }
}

}  // namespace basalt

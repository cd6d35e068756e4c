// Safetensors files: validated parsing, zero-copy memory-mapped reads, writing.
//
// Format: an 8-byte little-endian header length N, N bytes of JSON
//   {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
//    "__metadata__": {"<key>": "<string>"}}
// then the data section; data_offsets are byte offsets into the data section.
//
// Contract: files are untrusted input. Every field is validated before any
// byte of tensor data is touched, and any violation (truncation, bad JSON,
// unknown fields or dtypes, negative or overflowing shapes, offsets out of
// range, reversed or overlapping ranges, a size that disagrees with the shape)
// throws basalt::Error with a message of the form
//   "<file>: tensor '<name>': <problem>"   (or "<file>: <problem>" for the file).
// No input makes the parser crash, read out of bounds or allocate without
// bound; the header parser is fuzzed (fuzz/safetensors_header_fuzz.cc).
// Gaps between tensors are allowed (other readers tolerate them too);
// overlapping byte ranges are not.
//
// Tensors returned by SafetensorsFile::tensor() point into a read-only private
// mapping of the file, which they keep alive after the SafetensorsFile is
// gone. Writing through them faults: copy before modifying. If a file places
// a tensor at an offset that is not a multiple of its element size, that
// tensor comes back as an aligned copy, because misaligned typed access is
// undefined behaviour.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace basalt {

// Where one tensor lives inside a safetensors file.
struct SafetensorsEntry {
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // byte range [begin, end) within the data section
  uint64_t end = 0;

  uint64_t nbytes() const { return end - begin; }
};

// Tensor names to entries, ordered by name; std::less<> allows lookups by
// string_view without a temporary string.
using SafetensorsIndex = std::map<std::string, SafetensorsEntry, std::less<>>;

struct SafetensorsHeader {
  SafetensorsIndex tensors;
  std::map<std::string, std::string> metadata;  // the optional "__metadata__" object
};

// A validated file image: its header and the data section it describes.
struct SafetensorsView {
  SafetensorsHeader header;
  std::span<const uint8_t> data;  // points into the image passed to parse_image
};

// Limits that keep hostile headers from exhausting memory. The header limit
// is the one the reference implementation enforces; no real tensor has more
// than a handful of dimensions.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
inline constexpr size_t kSafetensorsMaxRank = 32;

class MappedFile;

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates it. Throws basalt::Error naming the
  // file (and the tensor, where one is at fault).
  static SafetensorsFile open(const std::string& path);

  // Validates header JSON for a data section of `data_size` bytes; `label`
  // (usually the file path) prefixes every error message.
  static SafetensorsHeader parse_header(std::string_view header_json, uint64_t data_size,
                                        const std::string& label);

  // Validates a whole file image: length prefix, header and data bounds.
  static SafetensorsView parse_image(std::span<const uint8_t> image, const std::string& label);

  const std::string& path() const { return path_; }
  const SafetensorsIndex& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // The entry for `name`, or null when the file has no such tensor.
  const SafetensorsEntry* find(std::string_view name) const;
  // The data section, inside the mapping.
  std::span<const uint8_t> data() const { return data_; }
  uint64_t file_size() const;

  // A zero-copy view of tensor `name` (an aligned copy if its offset is
  // misaligned). Throws when the file has no such tensor.
  Tensor tensor(std::string_view name) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  std::shared_ptr<const MappedFile> mapping_;
  SafetensorsHeader header_;
  std::span<const uint8_t> data_;
};

// A name read from an untrusted file, made safe to quote in an error message:
// control characters escaped as \xNN, names over 200 bytes shortened.
std::string printable_name(std::string_view name);

// The dtype's name in the safetensors format ("F32", "BF16", "I8", ...),
// the inverse of dtype_from_safetensors.
std::string_view safetensors_dtype_name(DType dtype);

// Writes host tensors to `path` as safetensors in the layout the reference
// writer uses: header padded with spaces to a multiple of 8 bytes, tensors
// stored back to back without gaps, larger element types first, so that every
// tensor is aligned to its element size in the file (and so in a mapping).
// Writes to "<path>.partial" and renames, so a failed write never leaves a
// truncated file under the final name. Throws basalt::Error on I/O failure,
// duplicate names, device tensors or names that are not valid UTF-8.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace basalt

// libFuzzer target for the safetensors header parser.
//
// Contract under test: for any bytes, SafetensorsFile::parse_image and
// parse_header either return an index whose every entry lies inside the data
// section with a size that matches its dtype and shape, or throw
// basalt::Error. A crash, a sanitizer report, any other exception or a
// violated invariant is a bug.
//
// Each input is tried twice: as a whole file image (length prefix, header,
// data), and with the first 8 bytes read as the data size and the rest as the
// header JSON, so that mutations of the JSON reach the parser even when they
// break the length prefix.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string_view>

#include "core/error.h"
#include "model/safetensors.h"

namespace {

void check_invariants(const basalt::SafetensorsHeader& header, uint64_t data_size) {
  for (const auto& [name, entry] : header.tensors) {
    uint64_t numel = 1;
    for (int64_t dim : entry.shape) {
      if (dim < 0) std::abort();
      numel *= static_cast<uint64_t>(dim);  // cannot overflow: the parser checked it
    }
    if (entry.begin > entry.end || entry.end > data_size) std::abort();
    if (entry.end - entry.begin != numel * basalt::dtype_size(entry.dtype)) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> image(data, size);
  try {
    const basalt::SafetensorsView view = basalt::SafetensorsFile::parse_image(image, "fuzz");
    check_invariants(view.header, view.data.size());
  } catch (const basalt::Error&) {
  }

  if (size >= 8) {
    uint64_t data_size = 0;
    for (int i = 7; i >= 0; --i) data_size = (data_size << 8) | data[i];
    const std::string_view header(reinterpret_cast<const char*>(data) + 8, size - 8);
    try {
      check_invariants(basalt::SafetensorsFile::parse_header(header, data_size, "fuzz"), data_size);
    } catch (const basalt::Error&) {
    }
  }
  return 0;
}

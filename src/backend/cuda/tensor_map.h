// TMA tensor maps (the driver's CUtensorMap) for the kernels that load tiles
// with cp.async.bulk.tensor (tma.cuh): an opaque 128-byte descriptor the
// kernels take as a parameter or read from global memory, and its encoding
// on the host. The header needs no CUDA header, so kernel launch headers can
// carry descriptors.
//
// Contract: encode_rows_u8 describes `rows` rows of `row_bytes` bytes each,
// `row_bytes` apart from `base`, as a 2-D tensor of bytes whose boxes are
// `box_rows` rows of `box_bytes` bytes (box_bytes <= 128), laid out in shared
// memory in the 128-byte swizzle that wgmma's K-major descriptors read
// (wgmma.cuh); bytes outside the tensor load as zeros. It returns an empty
// string, or why the driver refused (alignment: base and row_bytes must be
// multiples of 16; sizes: rows < 2^32, box_rows <= 256). The driver's
// encoder is found through the CUDA runtime once, so nothing links libcuda.
#pragma once

#include <cstdint>
#include <string>

namespace basalt {

struct alignas(128) TmaDescriptor {
  uint64_t opaque[16];
};

std::string encode_rows_u8(TmaDescriptor& out, const void* base, uint64_t rows, uint64_t row_bytes,
                           uint32_t box_rows, uint32_t box_bytes);

}  // namespace basalt

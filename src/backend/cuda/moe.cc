#include "backend/cuda/moe.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "backend/cuda/device.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/kernel_caps.h"
#include "backend/cuda/moe_gemm_kernels.h"
#include "backend/cuda/moe_kernels.h"
#include "backend/cuda/tensor_map.h"
#include "core/error.h"

namespace basalt {
namespace {

void require(const Tensor& t, const char* name, DType dtype, int rank) {
  BASALT_CHECK(t.device() == Device::kCuda && t.dtype() == dtype && t.rank() == rank,
               "cuda moe_route: {} must be a device {} tensor of rank {}, got {}", name, dtype_name(dtype), rank,
               t.describe());
}

}  // namespace

void cuda_moe_route(const Tensor& logits, const Tensor* bias, const MoeRouteParams& p, Tensor& ids,
                    Tensor& weights, cudaStream_t stream) {
  using cuda_kernels::kMoeMaxExperts;
  using cuda_kernels::kMoeMaxGroups;
  using cuda_kernels::kMoeMaxTopK;
  require(logits, "logits", DType::kF32, 2);
  const int64_t T = logits.dim(0), E = logits.dim(1);
  BASALT_CHECK(p.top_k > 0 && p.num_groups > 0 && E % p.num_groups == 0 && p.topk_groups > 0 &&
                   p.topk_groups <= p.num_groups && p.top_k <= p.topk_groups * (E / p.num_groups),
               "cuda moe_route: top_k {}, num_groups {}, topk_groups {} do not fit {} experts", p.top_k,
               p.num_groups, p.topk_groups, E);
  BASALT_CHECK(E <= kMoeMaxExperts && p.num_groups <= kMoeMaxGroups && p.top_k <= kMoeMaxTopK,
               "cuda moe_route: supports up to {} experts, {} groups and top_k {}; got {}, {} and {}", kMoeMaxExperts,
               kMoeMaxGroups, kMoeMaxTopK, E, p.num_groups, p.top_k);
  BASALT_CHECK(T <= std::numeric_limits<int32_t>::max(), "cuda moe_route: {} tokens are too many", T);
  require(ids, "ids", DType::kI32, 2);
  require(weights, "weights", DType::kF32, 2);
  BASALT_CHECK(ids.shape() == Shape({T, p.top_k}) && weights.shape() == Shape({T, p.top_k}),
               "cuda moe_route: ids {} and weights {} must be [{}, {}]", ids.describe(), weights.describe(), T,
               p.top_k);
  if (bias) {
    require(*bias, "bias", DType::kF32, 1);
    BASALT_CHECK(bias->dim(0) == E, "cuda moe_route: bias {} must be [{}]", bias->describe(), E);
  }
  if (T == 0) return;
  cuda_kernels::MoeRouteArgs args{};
  args.logits = logits.data<const float>();
  args.bias = bias ? bias->data<const float>() : nullptr;
  args.ids = ids.data<int32_t>();
  args.weights = weights.data<float>();
  args.tokens = T;
  args.experts = static_cast<int>(E);
  args.groups = p.num_groups;
  args.topk_groups = p.topk_groups;
  args.top_k = p.top_k;
  args.softmax = p.scoring == MoeScoring::kSoftmax;
  args.normalize = p.normalize;
  args.scaling = p.scaling;
  const cudaError_t status = cuda_kernels::moe_route(args, stream);
  BASALT_CHECK(status == cudaSuccess, "cuda moe_route: launch failed: {}", cudaGetErrorString(status));
}

// --- moe_experts ---------------------------------------------------------

namespace {

using cuda_kernels::MoeExpertPtrs;

// The FP8 GEMMs' multiply (cuda_kernels::MoeMmaMode) unless MoeOptions
// says: where wgmma runs, the kernel of the tile (kWgmmaTileM rows: the
// cp.async-fed one; kWgmmaTmaTileM: the TMA-fed one), else mma.sync e4m3.
int default_fp8_mma(int tile_m) {
  if (cuda_kernels::wgmma_available()) {
    if (tile_m == cuda_kernels::kWgmmaTileM) return cuda_kernels::kMoeMmaWgmma;
    if (tile_m == cuda_kernels::kWgmmaTmaTileM) return cuda_kernels::kMoeMmaWgmmaTma;
  }
  return cuda_kernels::kMoeMmaE4m3;
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t e = cudaStreamIsCapturing(stream, &status);
  BASALT_CHECK(e == cudaSuccess, "cuda moe_experts: cudaStreamIsCapturing failed: {}", cudaGetErrorString(e));
  return status != cudaStreamCaptureStatusNone;
}

const LinearWeight& matrix(const MoeExpert& e, int m) { return m == 0 ? e.gate : m == 1 ? e.up : e.down; }
const char* matrix_name(int m) { return m == 0 ? "gate" : m == 1 ? "up" : "down"; }

// What identifies a span's table: every matrix's pointers and dtype.
void signature_of(std::span<const MoeExpert> experts, std::vector<uint64_t>& sig) {
  sig.clear();
  sig.reserve(experts.size() * 9 + 2);
  for (const MoeExpert& e : experts)
    for (int m = 0; m < 3; ++m) {
      const LinearWeight& w = matrix(e, m);
      sig.push_back(reinterpret_cast<uintptr_t>(w.weight.raw()));
      sig.push_back(reinterpret_cast<uintptr_t>(w.scale_inv.raw()));
      sig.push_back(static_cast<uint64_t>(w.weight.dtype()));
    }
  const Tensor& g = experts[0].gate.weight;
  sig.push_back(g.rank() == 2 ? static_cast<uint64_t>(g.dim(0)) : 0);
  sig.push_back(g.rank() == 2 ? static_cast<uint64_t>(g.dim(1)) : 0);
}

int32_t kind_of(DType d) {
  switch (d) {
    case DType::kF32: return cuda_kernels::kMoeF32;
    case DType::kBF16: return cuda_kernels::kMoeBF16;
    case DType::kF16: return cuda_kernels::kMoeF16;
    default: return cuda_kernels::kMoeFp8;
  }
}

void fill_table(MoeExpertTable& t, std::span<const MoeExpert> experts, cudaStream_t stream) {
  auto* table = static_cast<MoeExpertPtrs*>(t.entries.raw());
  const int E = static_cast<int>(experts.size());
  for (int first = 0; first < E; first += cuda_kernels::kMoeTableChunk) {
    cuda_kernels::MoeTableChunk chunk{};
    chunk.first = first;
    chunk.count = std::min(cuda_kernels::kMoeTableChunk, E - first);
    for (int i = 0; i < chunk.count; ++i)
      for (int m = 0; m < 3; ++m) {
        const LinearWeight& w = matrix(experts[static_cast<size_t>(first + i)], m);
        chunk.e[i].w[m] = w.weight.raw();
        chunk.e[i].scale[m] = w.block_fp8() ? w.scale_inv.data<const float>() : nullptr;
        chunk.e[i].kind[m] = kind_of(w.weight.dtype());
      }
    const cudaError_t status = cuda_kernels::moe_fill_table(table, chunk, stream);
    BASALT_CHECK(status == cudaSuccess, "cuda moe_experts: table launch failed: {}", cudaGetErrorString(status));
  }
  if (t.weight_maps.defined()) {
    auto* maps = static_cast<TmaDescriptor*>(t.weight_maps.raw());
    const int M = 3 * E;
    for (int first = 0; first < M; first += cuda_kernels::kMoeTmaChunk) {
      cuda_kernels::MoeTmaChunk chunk{};
      chunk.first = first;
      chunk.count = std::min(cuda_kernels::kMoeTmaChunk, M - first);
      for (int i = 0; i < chunk.count; ++i) {
        const int e = (first + i) / 3, m = (first + i) % 3;
        const Tensor& w = matrix(experts[static_cast<size_t>(e)], m).weight;
        const std::string error =
            encode_rows_u8(chunk.d[i], w.raw(), static_cast<uint64_t>(w.dim(0)), static_cast<uint64_t>(w.dim(1)),
                           cuda_kernels::kMoeTmaBoxRows, cuda_kernels::kMoeTmaBoxBytes);
        BASALT_CHECK(error.empty(), "cuda moe_experts: expert {} {}: {}", e, matrix_name(m), error);
      }
      const cudaError_t status = cuda_kernels::moe_fill_tmaps(maps, chunk, stream);
      BASALT_CHECK(status == cudaSuccess, "cuda moe_experts: descriptor launch failed: {}", cudaGetErrorString(status));
    }
  }
  t.written = !capturing(stream);
}

MoeExpertTable build_table(std::span<const MoeExpert> experts, std::vector<uint64_t> signature) {
  const Tensor& g0 = experts[0].gate.weight;
  BASALT_CHECK(g0.rank() == 2 && g0.dim(0) > 0 && g0.dim(1) > 0,
               "cuda moe_experts: expert 0's gate must be [I, H] with I, H > 0, got {}", g0.describe());
  const int64_t I = g0.dim(0), H = g0.dim(1);
  bool all_bf16 = true, all_fp8 = true, aligned = true;
  for (size_t e = 0; e < experts.size(); ++e)
    for (int m = 0; m < 3; ++m) {
      const LinearWeight& w = matrix(experts[e], m);
      const int64_t N = m == 2 ? H : I, K = m == 2 ? I : H;
      const DType d = w.weight.dtype();
      BASALT_CHECK(w.weight.device() == Device::kCuda && w.weight.rank() == 2 && w.weight.dim(0) == N &&
                       w.weight.dim(1) == K &&
                       (d == DType::kF32 || d == DType::kBF16 || d == DType::kF16 || d == DType::kF8E4M3),
                   "cuda moe_experts: expert {} {} must be a device f32, bf16, f16 or f8_e4m3 [{}, {}], got {}", e,
                   matrix_name(m), N, K, w.weight.describe());
      if (d == DType::kF8E4M3) {
        const int64_t bn = (N + kFp8BlockSize - 1) / kFp8BlockSize, bk = (K + kFp8BlockSize - 1) / kFp8BlockSize;
        BASALT_CHECK(w.scale_inv.raw() != nullptr && w.scale_inv.device() == Device::kCuda &&
                         w.scale_inv.dtype() == DType::kF32 && w.scale_inv.shape() == Shape({bn, bk}),
                     "cuda moe_experts: expert {} {} is f8_e4m3 and needs a device f32 scale_inv [{}, {}], got {}", e,
                     matrix_name(m), bn, bk, w.scale_inv.describe());
      } else {
        BASALT_CHECK(w.scale_inv.raw() == nullptr, "cuda moe_experts: expert {} {} is {} but has a scale_inv {}", e,
                     matrix_name(m), dtype_name(d), w.scale_inv.describe());
      }
      all_bf16 = all_bf16 && d == DType::kBF16;
      all_fp8 = all_fp8 && d == DType::kF8E4M3;
      aligned = aligned && reinterpret_cast<uintptr_t>(w.weight.raw()) % 16 == 0;
    }
  MoeExpertTable t;
  t.experts = static_cast<int64_t>(experts.size());
  t.hidden = H;
  t.inter = I;
  // The grouped GEMMs read rows in 16-byte pieces.
  if (all_fp8 && aligned && H % 16 == 0 && I % 16 == 0) {
    t.path = MoeExpertTable::Path::kFp8;
  } else if (all_bf16 && aligned && H % 8 == 0 && I % 8 == 0) {
    t.path = MoeExpertTable::Path::kBf16;
  } else {
    t.path = MoeExpertTable::Path::kGeneric;
  }
  t.entries = cuda_empty({t.experts * static_cast<int64_t>(sizeof(MoeExpertPtrs))}, DType::kF8E4M3);  // raw bytes
  if (t.path == MoeExpertTable::Path::kFp8 && cuda_kernels::wgmma_available())
    t.weight_maps = cuda_empty({t.experts * 3 * static_cast<int64_t>(sizeof(TmaDescriptor))}, DType::kF8E4M3);
  t.signature = std::move(signature);
  return t;
}

void require_device(const Tensor& t, const char* name) {
  BASALT_CHECK(t.device() == Device::kCuda, "cuda moe_experts: {} must be on the device, got {}", name,
               t.describe());
}

void check_launch(cudaError_t status, const char* what) {
  BASALT_CHECK(status == cudaSuccess, "cuda moe_experts: {} launch failed: {}", what, cudaGetErrorString(status));
}

}  // namespace

const MoeExpertTable& MoeExpertTables::get(std::span<const MoeExpert> experts, cudaStream_t stream) {
  BASALT_CHECK(!experts.empty(), "cuda moe_experts: no experts");
  BASALT_CHECK(experts.size() <= static_cast<size_t>(cuda_kernels::kMoeExpertsMax),
               "cuda moe_experts: supports up to {} experts, got {}", cuda_kernels::kMoeExpertsMax, experts.size());
  std::vector<uint64_t> sig;
  signature_of(experts, sig);
  const std::pair<const void*, size_t> key{experts[0].gate.weight.raw(), experts.size()};
  auto it = tables_.find(key);
  if (it == tables_.end() || it->second.signature != sig) {
    MoeExpertTable built = build_table(experts, std::move(sig));
    if (it == tables_.end())
      it = tables_.emplace(key, std::move(built)).first;
    else
      it->second = std::move(built);
  }
  if (!it->second.written) fill_table(it->second, experts, stream);
  return it->second;
}

void cuda_moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const MoeExpertTable& table,
                      Tensor& out, cudaStream_t stream, const MoeOptions& options, const MoeStageEvents* events) {
  require_device(x, "x");
  require_device(ids, "ids");
  require_device(weights, "weights");
  require_device(out, "out");
  BASALT_CHECK(x.rank() == 2 && (x.dtype() == DType::kF32 || x.dtype() == DType::kBF16) && x.dim(1) == table.hidden,
               "cuda moe_experts: x must be f32 or bf16 [T, {}], got {}", table.hidden, x.describe());
  const int64_t T = x.dim(0), H = table.hidden, I = table.inter;
  BASALT_CHECK(ids.rank() == 2 && ids.dtype() == DType::kI32 && ids.dim(0) == T && ids.dim(1) > 0,
               "cuda moe_experts: ids must be i32 [{}, k > 0], got {}", T, ids.describe());
  const int64_t k = ids.dim(1);
  BASALT_CHECK(weights.dtype() == DType::kF32 && weights.shape() == Shape({T, k}),
               "cuda moe_experts: weights must be f32 [{}, {}], got {}", T, k, weights.describe());
  BASALT_CHECK(out.dtype() == DType::kF32 && out.shape() == Shape({T, H}),
               "cuda moe_experts: out must be f32 [{}, {}], got {}", T, H, out.describe());
  const auto* xb = static_cast<const char*>(x.raw());
  const auto* ob = static_cast<const char*>(out.raw());
  BASALT_CHECK(T == 0 || ob + out.nbytes() <= xb || xb + x.nbytes() <= ob, "cuda moe_experts: out must not overlap x");
  BASALT_CHECK(T * k <= std::numeric_limits<int32_t>::max() && T * std::max(H, I) < (int64_t{1} << 40),
               "cuda moe_experts: {} tokens x {} slots are too many", T, k);
  BASALT_CHECK(options.tile_m == 0 || options.tile_m == 16 || options.tile_m == 64 || options.tile_m == 128 ||
                   options.tile_m == cuda_kernels::kWgmmaTmaTileM,
               "cuda moe_experts: tile_m {} is not 0, 16, 64, 128 or {}", options.tile_m,
               cuda_kernels::kWgmmaTmaTileM);
  if (T == 0) return;
  auto mark = [&](int i) {
    if (events) BASALT_CHECK(cudaEventRecord(events->at[i], stream) == cudaSuccess, "cuda moe_experts: event");
  };
  const int64_t R = T * k, E = table.experts;
  MoeExpertTable::Path path = options.generic ? MoeExpertTable::Path::kGeneric : table.path;
  // The bf16 GEMM reads a bf16 x in place, in 16-byte pieces.
  if (path == MoeExpertTable::Path::kBf16 && x.dtype() == DType::kBF16 && reinterpret_cast<uintptr_t>(x.raw()) % 16 != 0)
    path = MoeExpertTable::Path::kGeneric;

  // Tile rows by the mean rows per used expert (at most min(E, R) are
  // used): 16 for decode (bound by the weights' bytes either way); above, 64
  // and 128 on mma.sync. FP8 where wgmma runs: 64 (the cp.async-fed wgmma
  // kernel) up to 64 rows, then the TMA-fed kernel's 192, whose tiles hold a
  // whole expert of up to 192 rows, so its weights cross from L2 once per
  // column block: the same bits, 1.35x the whole op at 4K tokens (128 rows
  // an expert), even at 32 (bench/README.md).
  int tile_m = options.tile_m;
  if (tile_m == 0) {
    const int64_t used = std::min(E, R), mean = (R + used - 1) / used;
    const bool fp8_wgmma = path == MoeExpertTable::Path::kFp8 && cuda_kernels::wgmma_available();
    if (fp8_wgmma &&
        (options.fp8_mma == cuda_kernels::kMoeMmaWgmmaTma || options.fp8_mma == cuda_kernels::kMoeMmaWgmmaTmaPair))
      tile_m = cuda_kernels::kWgmmaTmaTileM;
    else if (fp8_wgmma && options.fp8_mma < 0)
      tile_m = mean <= 16 ? 16 : mean <= 64 ? cuda_kernels::kWgmmaTileM : cuda_kernels::kWgmmaTmaTileM;
    else
      tile_m = mean <= 16 ? 16 : mean <= 64 ? 64 : 128;
  }
  const int64_t max_tiles = std::min(R, (R + std::min(E, R) * (tile_m - 1)) / tile_m);
  // The FP8 multiply, checked before anything is launched.
  const int mode = options.fp8_mma >= 0 ? options.fp8_mma : default_fp8_mma(tile_m);
  const bool wgmma = mode == cuda_kernels::kMoeMmaWgmma || mode == cuda_kernels::kMoeMmaWgmmaPrecise;
  const bool tma = path == MoeExpertTable::Path::kFp8 &&
                   (mode == cuda_kernels::kMoeMmaWgmmaTma || mode == cuda_kernels::kMoeMmaWgmmaTmaPair);
  BASALT_CHECK(path != MoeExpertTable::Path::kFp8 || !wgmma ||
                   (tile_m == cuda_kernels::kWgmmaTileM && cuda_kernels::wgmma_available()),
               "cuda moe_experts: the wgmma multiply needs an sm_90a build on an sm_90 device and {}-row tiles "
               "(tile_m {})",
               cuda_kernels::kWgmmaTileM, tile_m);
  BASALT_CHECK(!tma || (tile_m == cuda_kernels::kWgmmaTmaTileM && table.weight_maps.defined()),
               "cuda moe_experts: the TMA-fed wgmma multiply needs an sm_90a build on an sm_90 device and {}-row "
               "tiles (tile_m {})",
               cuda_kernels::kWgmmaTmaTileM, tile_m);
  BASALT_CHECK(tile_m != cuda_kernels::kWgmmaTmaTileM || tma || path == MoeExpertTable::Path::kGeneric,
               "cuda moe_experts: {}-row tiles are the TMA-fed wgmma multiply's", cuda_kernels::kWgmmaTmaTileM);

  // Scratch of the permutation: tiles (int4), the tile count, row_pair, pair_row.
  Tensor index = cuda_empty({4 * max_tiles + 4 + 2 * R}, DType::kI32);
  int32_t* base = index.data<int32_t>();
  auto* tiles = reinterpret_cast<int4*>(base);
  int32_t* num_tiles = base + 4 * max_tiles;
  int32_t* row_pair = num_tiles + 4;
  int32_t* pair_row = row_pair + R;

  mark(0);
  cuda_kernels::MoePermuteArgs perm{};
  perm.ids = ids.data<const int32_t>();
  perm.first_expert = options.first_expert;
  perm.pairs = static_cast<int32_t>(R);
  perm.experts = static_cast<int32_t>(E);
  perm.tile_m = tile_m;
  perm.row_pair = row_pair;
  perm.pair_row = pair_row;
  perm.tiles = tiles;
  perm.num_tiles = num_tiles;
  check_launch(cuda_kernels::moe_permute(perm, stream), "permutation");

  const auto* entries = static_cast<const MoeExpertPtrs*>(table.entries.raw());
  Tensor y = cuda_empty({R, H}, DType::kF32);
  cuda_kernels::MoeGemmArgs g{};
  g.row_pair = row_pair;
  g.top_k = static_cast<int32_t>(k);
  g.table = entries;
  g.tiles = tiles;
  g.num_tiles = num_tiles;
  const int launch_tiles = static_cast<int>(max_tiles);

  if (path == MoeExpertTable::Path::kFp8) {
    const int64_t groups_h = (H + kFp8BlockSize - 1) / kFp8BlockSize;
    const int64_t groups_i = (I + kFp8BlockSize - 1) / kFp8BlockSize;
    Tensor xq = cuda_empty({T, H}, DType::kF8E4M3), xs = cuda_empty({T, groups_h}, DType::kF32);
    cuda_quantize_fp8_groups(x, xq, xs, stream);
    const auto* maps = tma ? static_cast<const TmaDescriptor*>(table.weight_maps.raw()) : nullptr;
    // The TMA-fed GEMM reads whole boxes of rows: x's rows in expert order.
    if (tma) {
      Tensor xp = cuda_empty({R, H}, DType::kF8E4M3), xps = cuda_empty({R, groups_h}, DType::kF32);
      check_launch(cuda_kernels::moe_gather_fp8_rows(static_cast<const uint8_t*>(xq.raw()), xs.data<const float>(),
                                                     row_pair, static_cast<int32_t>(k), static_cast<int32_t>(R),
                                                     static_cast<int32_t>(H), static_cast<int32_t>(groups_h),
                                                     static_cast<uint8_t*>(xp.raw()), xps.data<float>(), stream),
                   "row gather");
      xq = xp;
      xs = xps;
    }
    mark(1);
    // One grouped GEMM on rows `a` (R rows of K bytes when tma, else gathered).
    const auto gemm = [&](const Tensor& a, bool gated, const char* what) {
      if (!tma) {
        check_launch(cuda_kernels::moe_gemm(g, mode, gated, tile_m, launch_tiles, stream), what);
        return;
      }
      TmaDescriptor map_a;
      const std::string error = encode_rows_u8(map_a, a.raw(), static_cast<uint64_t>(R), static_cast<uint64_t>(g.k),
                                               cuda_kernels::kMoeTmaActBoxRows, cuda_kernels::kMoeTmaBoxBytes);
      BASALT_CHECK(error.empty(), "cuda moe_experts: {}: {}", what, error);
      const int cluster = mode == cuda_kernels::kMoeMmaWgmmaTmaPair ? 2 : 1;
      check_launch(cuda_kernels::moe_gemm_tma(g, map_a, maps, gated, launch_tiles, cluster, stream), what);
    };
    Tensor act = cuda_empty({R, I}, DType::kF32);
    g.a = static_cast<const uint8_t*>(xq.raw());
    g.a_scale = xs.data<const float>();
    g.gather = !tma;
    g.out = act.raw();
    g.out_bf16 = false;
    g.n = static_cast<int32_t>(I);
    g.k = static_cast<int32_t>(H);
    gemm(xq, true, "gate/up GEMM");
    mark(2);
    Tensor aq = cuda_empty({R, I}, DType::kF8E4M3), as = cuda_empty({R, groups_i}, DType::kF32);
    cuda_quantize_fp8_groups(act, aq, as, stream);
    mark(3);
    g.a = static_cast<const uint8_t*>(aq.raw());
    g.a_scale = as.data<const float>();
    g.gather = false;
    g.out = y.raw();
    g.n = static_cast<int32_t>(H);
    g.k = static_cast<int32_t>(I);
    gemm(aq, false, "down GEMM");
    mark(4);
  } else if (path == MoeExpertTable::Path::kBf16) {
    Tensor xb16;
    if (x.dtype() == DType::kBF16) {
      xb16 = x;
    } else {
      xb16 = cuda_empty({T, H}, DType::kBF16);
      check_launch(cuda_kernels::moe_to_bf16(x.data<const float>(), xb16.raw(), T * H, stream), "bf16 rounding");
    }
    mark(1);
    Tensor act = cuda_empty({R, I}, DType::kBF16);
    g.a = static_cast<const uint8_t*>(xb16.raw());
    g.gather = true;
    g.out = act.raw();
    g.out_bf16 = true;
    g.n = static_cast<int32_t>(I);
    g.k = static_cast<int32_t>(H);
    check_launch(cuda_kernels::moe_gemm(g, cuda_kernels::kMoeMmaBf16, true, tile_m, launch_tiles, stream),
                 "gate/up GEMM");
    mark(2);
    mark(3);
    g.a = static_cast<const uint8_t*>(act.raw());
    g.gather = false;
    g.out = y.raw();
    g.out_bf16 = false;
    g.n = static_cast<int32_t>(H);
    g.k = static_cast<int32_t>(I);
    check_launch(cuda_kernels::moe_gemm(g, cuda_kernels::kMoeMmaBf16, false, tile_m, launch_tiles, stream),
                 "down GEMM");
    mark(4);
  } else {
    mark(1);
    Tensor act = cuda_empty({R, I}, DType::kF32);
    cuda_kernels::MoeGenericArgs a{};
    a.a = x.raw();
    a.a_bf16 = x.dtype() == DType::kBF16;
    a.ids = ids.data<const int32_t>();
    a.first_expert = options.first_expert;
    a.row_pair = row_pair;
    a.top_k = static_cast<int32_t>(k);
    a.gather = true;
    a.table = entries;
    a.out = act.data<float>();
    a.rows = static_cast<int32_t>(R);
    a.n = static_cast<int32_t>(I);
    a.k = static_cast<int32_t>(H);
    check_launch(cuda_kernels::moe_generic_gemm(a, true, stream), "generic gate/up GEMM");
    mark(2);
    mark(3);
    a.a = act.raw();
    a.a_bf16 = false;
    a.gather = false;
    a.out = y.data<float>();
    a.n = static_cast<int32_t>(H);
    a.k = static_cast<int32_t>(I);
    check_launch(cuda_kernels::moe_generic_gemm(a, false, stream), "generic down GEMM");
    mark(4);
  }
  check_launch(cuda_kernels::moe_unpermute(y.data<const float>(), pair_row, weights.data<const float>(),
                                           out.data<float>(), static_cast<int32_t>(T), static_cast<int32_t>(k),
                                           static_cast<int32_t>(H), stream),
               "un-permutation");
  mark(5);
}

void cuda_moe_combine(const Tensor& rows, const Tensor& positions, const Tensor& weights, Tensor& out,
                      cudaStream_t stream) {
  for (const Tensor* t : {&rows, &positions, &weights, static_cast<const Tensor*>(&out)})
    BASALT_CHECK(t->device() == Device::kCuda, "cuda moe_combine: {} is not on the device", t->describe());
  const int64_t T = positions.dim(0), K = positions.dim(1), H = rows.dim(1);
  BASALT_CHECK(T <= std::numeric_limits<int32_t>::max() && K <= std::numeric_limits<int32_t>::max() &&
                   H <= std::numeric_limits<int32_t>::max(),
               "cuda moe_combine: {} x {} pairs of {} columns is past the kernel's range", T, K, H);
  check_launch(cuda_kernels::moe_unpermute(rows.data<const float>(), positions.data<const int32_t>(),
                                           weights.data<const float>(), out.data<float>(), static_cast<int32_t>(T),
                                           static_cast<int32_t>(K), static_cast<int32_t>(H), stream),
               "combine");
}

}  // namespace basalt

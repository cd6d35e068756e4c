#include "backend/cuda/cuda_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/dequantized.h"
#include "backend/cuda/fp8_linear.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/mla.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/sampling.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace basalt {

class CudaBackend::Profiler {
 public:
  ~Profiler() {
    for (auto& [start, stop] : pool_) {
      (void)cudaEventDestroy(start);
      (void)cudaEventDestroy(stop);
    }
  }
  // The event pair of a new call, recorded at its start.
  size_t begin(std::string op, double bytes, double flops, cudaStream_t stream) {
    if (used_ == pool_.size()) {
      cudaEvent_t start, stop;
      BASALT_CUDA_CHECK(cudaEventCreate(&start));
      BASALT_CUDA_CHECK(cudaEventCreate(&stop));
      pool_.emplace_back(start, stop);
    }
    calls_.push_back({std::move(op), bytes, flops, used_});
    BASALT_CUDA_CHECK(cudaEventRecord(pool_[used_].first, stream));
    return used_++;
  }
  void end(size_t pair, cudaStream_t stream) { BASALT_CUDA_CHECK(cudaEventRecord(pool_[pair].second, stream)); }

  std::vector<OpTime> collect(cudaStream_t stream) {
    BASALT_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<OpTime> totals;
    std::map<std::string, size_t> index;
    for (const Call& c : calls_) {
      float ms = 0;
      BASALT_CUDA_CHECK(cudaEventElapsedTime(&ms, pool_[c.pair].first, pool_[c.pair].second));
      auto [it, fresh] = index.emplace(c.op, totals.size());
      if (fresh) totals.push_back(OpTime{c.op});
      OpTime& t = totals[it->second];
      ++t.calls;
      t.ms += ms;
      t.bytes += c.bytes;
      t.flops += c.flops;
    }
    calls_.clear();
    used_ = 0;
    return totals;
  }

 private:
  struct Call {
    std::string op;
    double bytes, flops;
    size_t pair;
  };
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> pool_;
  size_t used_ = 0;
  std::vector<Call> calls_;
};

// Brackets one op with the profiler's events (nothing when profiling is off).
class OpScope {
 public:
  OpScope(CudaBackend& backend, const char* op, double bytes, double flops = 0)
      : backend_(backend), owner_(backend.owner_) {
    if (backend_.profiler_) pair_ = backend_.profiler_->begin(op, bytes, flops, backend_.stream_);
  }
  OpScope(CudaBackend& backend, std::string op, double bytes, double flops)
      : backend_(backend), owner_(backend.owner_) {
    if (backend_.profiler_) pair_ = backend_.profiler_->begin(std::move(op), bytes, flops, backend_.stream_);
  }
  ~OpScope() {
    if (backend_.profiler_ && pair_ != kNone) backend_.profiler_->end(pair_, backend_.stream_);
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  static constexpr size_t kNone = ~size_t{0};
  CudaBackend& backend_;
  CudaAllocationOwner owner_;  // the op's scratch is this backend's
  size_t pair_ = kNone;
};

namespace {

double bytes_of(std::initializer_list<const Tensor*> tensors) {
  double total = 0;
  for (const Tensor* t : tensors)
    if (t != nullptr) total += static_cast<double>(t->nbytes());
  return total;
}

}  // namespace

void CudaBackend::set_gemm_tuning(bool on) { blas_->set_tuning(on); }

GemmTuningStats CudaBackend::gemm_tuning_stats() const { return blas_->tuning_stats(); }

void CudaBackend::set_profiling(bool on) {
  if (on && !profiler_) profiler_ = std::make_unique<Profiler>();
  if (!on) profiler_.reset();
}

std::vector<OpTime> CudaBackend::profile() {
  return profiler_ ? profiler_->collect(stream_) : std::vector<OpTime>{};
}

namespace {
std::atomic<uint32_t> next_allocation_owner{1};
}  // namespace

CudaBackend::CudaBackend(int ordinal) : ordinal_(ordinal), owner_(next_allocation_owner.fetch_add(1)) {
  BASALT_CHECK(cuda_available(), "no CUDA device is available");
  int count = 0;
  BASALT_CUDA_CHECK(cudaGetDeviceCount(&count));
  BASALT_CHECK(ordinal >= 0 && ordinal < count, "CUDA device {} does not exist ({} present)", ordinal, count);
  BASALT_CUDA_CHECK(cudaSetDevice(ordinal));
  // A blocking stream: work on the legacy default stream (plain cudaMemcpy in
  // tools and tests) stays ordered with it, so cached blocks are safe to reuse.
  BASALT_CUDA_CHECK(cudaStreamCreate(&stream_));
  blas_ = std::make_unique<CublasLt>();
  fp8_ = std::make_unique<CudaFp8Linear>();
  mla_ = std::make_unique<CudaMla>(stream_);
  moe_tables_ = std::make_unique<MoeExpertTables>();
  dequantized_ = std::make_unique<CudaDequantizedWeights>();
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  for (Staging& s : staging_) {
    if (s.host != nullptr) (void)cudaFreeHost(s.host);
    if (s.copied != nullptr) (void)cudaEventDestroy(s.copied);
  }
  for (Pinned& p : free_pinned_) {
    if (p.host != nullptr) (void)cudaFreeHost(p.host);
    if (p.copied != nullptr) (void)cudaEventDestroy(p.copied);
  }
}

void CudaBackend::set_batch_invariant(bool on) {
  batch_invariant_ = on;
  mla_->set_row_invariant(on);
}

void CudaBackend::make_current() {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == ordinal_) return;
  BASALT_CUDA_CHECK(cudaSetDevice(ordinal_));
}

void CudaBackend::synchronize() { BASALT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

Tensor CudaBackend::empty(Shape shape, DType dtype) {
  const CudaAllocationOwner mine(owner_);
  return cuda_empty(std::move(shape), dtype);
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  BASALT_CHECK(src.dtype() == dst.dtype() && src.shape() == dst.shape(), "cuda copy: {} into {}", src.describe(),
               dst.describe());
  if (src.nbytes() == 0) return;
  const bool from_host = src.device() == Device::kCpu, to_host = dst.device() == Device::kCpu;
  const cudaMemcpyKind kind = from_host ? (to_host ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice)
                                        : (to_host ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice);
  if (kind == cudaMemcpyHostToDevice && src.nbytes() >= kStagedCopyMinBytes) {
    copy_staged_to_device(src.raw(), dst.raw(), src.nbytes());
  } else {
    BASALT_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), kind, stream_));
  }
  // The host side may be read or freed as soon as copy returns.
  if (from_host || to_host) synchronize();
}

namespace {

// Pinned host memory of at least `bytes` at `host` (its contents not kept).
void grow_pinned(void*& host, size_t& capacity, size_t bytes) {
  if (capacity >= bytes) return;
  if (host != nullptr) BASALT_CUDA_CHECK(cudaFreeHost(host));
  host = nullptr;
  capacity = 0;
  BASALT_CUDA_CHECK(cudaMallocHost(&host, bytes));
  capacity = bytes;
}

// memcpy split over the pool's threads (the caller's alone without one),
// each given at least 2 MiB.
void parallel_memcpy(void* dst, const void* src, size_t bytes, ThreadPool* pool) {
  constexpr size_t kMinShare = size_t{2} << 20;
  const size_t shares = pool == nullptr ? 1 : std::clamp<size_t>(bytes / kMinShare, 1, pool->size());
  if (shares == 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const size_t share = (bytes + shares - 1) / shares;
  pool->parallel_for(static_cast<int64_t>(shares), [&](int64_t first, int64_t last) {
    const size_t begin = static_cast<size_t>(first) * share, end = std::min(bytes, static_cast<size_t>(last) * share);
    if (begin < end) std::memcpy(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin, end - begin);
  });
}

}  // namespace

void CudaBackend::stage_and_copy(const void* src, void* dst, size_t bytes, ThreadPool* copy_pool) {
  Staging& s = staging_[next_staging_];
  next_staging_ = (next_staging_ + 1) % kStagingBuffers;
  if (s.copied == nullptr) BASALT_CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
  BASALT_CUDA_CHECK(cudaEventSynchronize(s.copied));  // its last copy has run (at once when never recorded)
  grow_pinned(s.host, s.capacity, bytes);
  parallel_memcpy(s.host, src, bytes, copy_pool);
  BASALT_CUDA_CHECK(cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyHostToDevice, stream_));
  BASALT_CUDA_CHECK(cudaEventRecord(s.copied, stream_));
}

void CudaBackend::copy_staged_to_device(const void* src, void* dst, size_t bytes) {
  // Threads for the host side: the page cache's memcpy runs at a few GB/s
  // per core, the DMA at tens; a few cores keep the copy engine busy.
  // The threads are made once, at the first such copy, and kept (a load
  // makes thousands of chunks).
  if (copy_pool_ == nullptr) {
    const int threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency() / 2), 1, 8);
    copy_pool_ = std::make_unique<ThreadPool>(threads);
  }
  for (size_t offset = 0; offset < bytes; offset += kStagedChunkBytes) {
    const size_t n = std::min(kStagedChunkBytes, bytes - offset);
    stage_and_copy(static_cast<const char*>(src) + offset, static_cast<char*>(dst) + offset, n, copy_pool_.get());
  }
}

void CudaBackend::upload(const Tensor& src, Tensor& dst) {
  BASALT_CHECK(src.device() == Device::kCpu && dst.device() == Device::kCuda,
               "cuda upload: {} into {} is not host to device", src.describe(), dst.describe());
  BASALT_CHECK(src.dtype() == dst.dtype() && src.shape() == dst.shape(), "cuda upload: {} into {}", src.describe(),
               dst.describe());
  const size_t bytes = src.nbytes();
  if (bytes == 0) return;
  stage_and_copy(src.raw(), dst.raw(), bytes, nullptr);
}

// A download's pinned buffer and event, back to the backend once the copy
// has run (the backend outlives its downloads, as it does its tensors).
class CudaBackend::Download final : public Backend::PendingDownload {
 public:
  Download(CudaBackend& backend, Pinned pinned, void* dst, size_t bytes)
      : backend_(backend), pinned_(pinned), dst_(dst), bytes_(bytes) {}
  ~Download() override {
    if (pinned_.copied == nullptr) return;
    (void)cudaEventSynchronize(pinned_.copied);
    backend_.give_back_pinned(pinned_);
  }
  void wait() override {
    if (pinned_.copied == nullptr) return;
    BASALT_CUDA_CHECK(cudaEventSynchronize(pinned_.copied));
    std::memcpy(dst_, pinned_.host, bytes_);
    backend_.give_back_pinned(std::exchange(pinned_, Pinned{}));
  }

 private:
  CudaBackend& backend_;
  Pinned pinned_;
  void* dst_;
  size_t bytes_;
};

CudaBackend::Pinned CudaBackend::take_pinned(size_t bytes) {
  Pinned p;
  {
    std::lock_guard<std::mutex> lock(pinned_mu_);
    if (!free_pinned_.empty()) {
      p = free_pinned_.back();
      free_pinned_.pop_back();
    }
  }
  try {
    if (p.copied == nullptr) BASALT_CUDA_CHECK(cudaEventCreateWithFlags(&p.copied, cudaEventDisableTiming));
    grow_pinned(p.host, p.capacity, bytes);
  } catch (...) {
    give_back_pinned(p);
    throw;
  }
  return p;
}

void CudaBackend::give_back_pinned(Pinned pinned) {
  std::lock_guard<std::mutex> lock(pinned_mu_);
  free_pinned_.push_back(pinned);
}

std::unique_ptr<Backend::PendingDownload> CudaBackend::download(const Tensor& src, Tensor& dst) {
  BASALT_CHECK(src.device() == Device::kCuda && dst.device() == Device::kCpu,
               "cuda download: {} into {} is not device to host", src.describe(), dst.describe());
  BASALT_CHECK(src.dtype() == dst.dtype() && src.shape() == dst.shape(), "cuda download: {} into {}",
               src.describe(), dst.describe());
  const size_t bytes = src.nbytes();
  Pinned p = take_pinned(std::max<size_t>(bytes, 1));
  try {
    if (bytes > 0) BASALT_CUDA_CHECK(cudaMemcpyAsync(p.host, src.raw(), bytes, cudaMemcpyDeviceToHost, stream_));
    BASALT_CUDA_CHECK(cudaEventRecord(p.copied, stream_));
  } catch (...) {
    give_back_pinned(p);
    throw;
  }
  return std::make_unique<Download>(*this, p, dst.raw(), bytes);
}

namespace {

// A replay is one op to the profiler ("graph replay").
class CudaGraph final : public RecordedOps {
 public:
  CudaGraph(CudaBackend& backend, cudaGraphExec_t exec, cudaStream_t stream)
      : backend_(backend), exec_(exec), stream_(stream) {}
  ~CudaGraph() override { (void)cudaGraphExecDestroy(exec_); }
  void replay() override {
    OpScope scope(backend_, "graph replay", 0);
    BASALT_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
  }

 private:
  CudaBackend& backend_;
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<RecordedOps> CudaBackend::record(const std::function<void()>& ops) {
  // Events of the profiler do not belong in a graph: profiling pauses.
  std::unique_ptr<Profiler> paused = std::move(profiler_);
  struct Resume {
    std::unique_ptr<Profiler>& slot;
    std::unique_ptr<Profiler>& paused;
    ~Resume() { slot = std::move(paused); }
  } resume{profiler_, paused};
  CudaGraphPoolScope pool;
  // Relaxed: the allocator may cudaMalloc a new graph-pool block mid-capture.
  BASALT_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  try {
    ops();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    (void)cudaStreamEndCapture(stream_, &broken);
    if (broken != nullptr) (void)cudaGraphDestroy(broken);
    (void)cudaGetLastError();
    throw;
  }
  cudaGraph_t graph = nullptr;
  BASALT_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  BASALT_CUDA_CHECK(status);
  return std::make_unique<CudaGraph>(*this, exec, stream_);
}

void CudaBackend::embedding_impl(const Tensor& ids, const Tensor& table, Tensor& out) {
  const OpScope scope(*this, "embedding", 2.0 * static_cast<double>(out.nbytes()) + bytes_of({&ids}));
  cuda_embedding(ids, table, out, stream_);
}

void CudaBackend::linear_impl(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) {
  BASALT_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16,
               "cuda linear: activations must be f32 or bf16, got x {}", x.describe());
  BASALT_CHECK(w.dtype() == DType::kF32 || w.dtype() == DType::kBF16 || w.dtype() == DType::kF16,
               "cuda linear: weights must be f32, bf16 or f16 (block FP8 goes through linear_fp8_block), got {}",
               w.describe());
  BASALT_CHECK(out.dtype() == DType::kF32, "cuda linear: out must be f32, got {}", out.describe());
  if (bias) {
    BASALT_CHECK(bias->dtype() == DType::kF32, "cuda linear: bias must be f32, got {}", bias->describe());
  }
  const OpScope scope(*this, fmt::format("linear {}x{}", w.dim(0), w.rank() == 2 ? w.dim(1) : 0),
                      bytes_of({&x, &w, bias, &out}),
                      2.0 * static_cast<double>(x.dim(0)) * static_cast<double>(w.numel()));
  if (batch_invariant_) {
    // One kernel configuration for every row count (gemm.h).
    BASALT_CHECK(row_invariant_linear_fits(x, w),
                 "cuda linear: the batch-invariant mode multiplies bf16 or f16 weights with in_features a multiple "
                 "of 32 (16-byte aligned rows), got x {} and w {}",
                 x.describe(), w.describe());
    return row_invariant_linear(x, w, bias, out, stream_);
  }
  // Decode-sized M: the GEMV kernels stream the weights once and beat
  // cuBLASLt up to 8 rows on every Llama-8B shape, and up to 16 rows on
  // layers narrower than 16384 outputs (bench/README).
  if (w.dtype() != DType::kF32 && skinny_linear_fits(x, w) && (x.dim(0) <= 8 || w.dim(0) < 16384))
    return skinny_linear(x, w, bias, out, stream_);
  if (x.dtype() == w.dtype()) return blas_->linear(x, w, bias, out, stream_);
  Tensor rounded = cuda_empty(x.shape(), w.dtype());
  cuda_cast(x, rounded, stream_);
  blas_->linear(rounded, w, bias, out, stream_);
}

void CudaBackend::rms_norm_impl(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  const OpScope scope(*this, "rms_norm", bytes_of({&x, &weight, &out}));
  cuda_rms_norm(x, weight, eps, out, stream_);
}

void CudaBackend::add_rms_norm_impl(Tensor& residual, const Tensor& x, const Tensor& weight,
                                    float eps, Tensor& out) {
  const OpScope scope(*this, "add_rms_norm", bytes_of({&residual, &residual, &x, &weight, &out}));
  cuda_add_rms_norm(residual, x, weight, eps, out, stream_);
}

void CudaBackend::rope_impl(Tensor& x, const Tensor& positions, const RopeParams& params) {
  const OpScope scope(*this, "rope", bytes_of({&x, &x, &positions}));
  cuda_rope(x, positions, params, stream_);
}

void CudaBackend::store_kv_impl(const Tensor& k, const Tensor& v, const Tensor& slots,
                                Tensor& k_cache, Tensor& v_cache) {
  const OpScope scope(*this, "store_kv", 2.0 * bytes_of({&k, &v}) + bytes_of({&slots}));
  cuda_store_kv(k, v, slots, k_cache, v_cache, stream_);
}

void CudaBackend::qkv_rope_store_impl(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm,
                                      float eps, const Tensor& positions, const RopeParams& rope,
                                      int num_heads, int num_kv_heads, const Tensor& slots,
                                      Tensor& k_cache, Tensor& v_cache, Tensor& q_out) {
  const double kv_row = k_cache.rank() == 2 ? static_cast<double>(k_cache.dim(1) * dtype_size(k_cache.dtype())) : 0;
  const OpScope scope(*this, "qkv_rope_store",
                      bytes_of({&qkv, &q_out, &positions, &slots}) + 2.0 * kv_row * static_cast<double>(qkv.dim(0)));
  cuda_qkv_rope_store(qkv, q_norm, k_norm, eps, positions, rope, num_heads, num_kv_heads, slots, k_cache, v_cache,
                      q_out, stream_);
}

void CudaBackend::attention_impl(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                 const AttentionLayout& layout, const AttentionParams& params,
                                 Tensor& out) {
  // Every key and value row the layout names is read once.
  const double kv_row = static_cast<double>(params.num_kv_heads) * (params.head_dim + params.v_head_dim) *
                        static_cast<double>(dtype_size(k_cache.dtype()));
  const OpScope scope(*this, "attention",
                      bytes_of({&q, &out, &layout.kv_slots}) +
                          kv_row * static_cast<double>(layout.kv_slots.numel()));
  cuda_attention(q, k_cache, v_cache, layout, params, out, stream_,
                 batch_invariant_ ? CudaAttentionPath::kRowInvariant : CudaAttentionPath::kAuto);
}

void CudaBackend::silu_and_mul_impl(const Tensor& gate_up, Tensor& out) {
  const OpScope scope(*this, "silu_and_mul", bytes_of({&gate_up, &out}));
  cuda_silu_and_mul(gate_up, out, stream_);
}

void CudaBackend::add_impl(const Tensor& a, const Tensor& b, Tensor& out) {
  cuda_add(a, b, out, stream_);
}

void CudaBackend::softmax_impl(const Tensor& x, Tensor& out) {
  cuda_softmax(x, out, false, stream_);
}

void CudaBackend::log_softmax_impl(const Tensor& x, Tensor& out) {
  const OpScope scope(*this, "log_softmax", bytes_of({&x, &out}));
  cuda_softmax(x, out, true, stream_);
}

void CudaBackend::argmax_impl(const Tensor& logits, Tensor& out) {
  const OpScope scope(*this, "argmax", bytes_of({&logits, &out}));
  cuda_argmax(logits, out, stream_);
}

void CudaBackend::sample_impl(const Tensor& logits, std::span<const SamplingRow> rows,
                              Tensor& out) {
  const OpScope scope(*this, "sample", bytes_of({&logits, &out}));
  cuda_sample(logits, rows, out, stream_);
}

void CudaBackend::apply_token_bitmask_impl(Tensor& logits, const Tensor& bitmask) {
  cuda_apply_token_bitmask(logits, bitmask, stream_);
}

void CudaBackend::adjust_logits_impl(Tensor& logits, std::span<const LogitEdit> edits) {
  cuda_adjust_logits(logits, edits, stream_);
}

void CudaBackend::top_k_rows_impl(const Tensor& x, int k, Tensor& values, Tensor& ids) {
  const OpScope scope(*this, "top_k_rows", bytes_of({&x, &values, &ids}));
  cuda_top_k_rows(x, k, values, ids, stream_);
}

void CudaBackend::gather_rows_impl(const Tensor& x, const Tensor& cols, Tensor& out) {
  cuda_gather_rows(x, cols, out, stream_);
}

void CudaBackend::rank_rows_impl(const Tensor& x, const Tensor& cols, Tensor& out) {
  cuda_rank_rows(x, cols, out, stream_);
}

void CudaBackend::copy_indexed_impl(const Tensor& src, const Tensor& src_index, Tensor& dst,
                                    const Tensor& dst_index) {
  cuda_copy_indexed(src, src_index, dst, dst_index, stream_);
}

void CudaBackend::check_fp8_invariance(const char* op) const {
  BASALT_CHECK(!batch_invariant_ || fp8_compute_ == Fp8Compute::kW8A16,
               "cuda {}: the batch-invariant mode multiplies block-FP8 weights as w8a16 only (--fp8-compute "
               "w8a16): the FP8 GEMMs pick their kernel by row count",
               op);
}

void CudaBackend::linear_fp8_block_impl(const Tensor& x, const Tensor& w, const Tensor& scale_inv,
                                        Tensor& out) {
  check_fp8_invariance("linear_fp8_block");
  // Weight-only: the bf16 linear over the dequantized copy (its own op scope).
  if (fp8_compute_ == Fp8Compute::kW8A16)
    return linear_impl(x, dequantized_->bf16(LinearWeight{w, scale_inv}, "linear_fp8_block"), nullptr, out);
  const OpScope scope(*this, fmt::format("linear_fp8_block {}x{}", w.dim(0), w.rank() == 2 ? w.dim(1) : 0),
                      bytes_of({&x, &w, &scale_inv, &out}),
                      2.0 * static_cast<double>(x.dim(0)) * static_cast<double>(w.numel()));
  fp8_->linear(x, w, scale_inv, out, stream_);
}
void CudaBackend::moe_route_impl(const Tensor& logits, const Tensor* bias,
                                 const MoeRouteParams& params, Tensor& ids, Tensor& weights) {
  const OpScope scope(*this, "moe_route", bytes_of({&logits, bias, &ids, &weights}));
  cuda_moe_route(logits, bias, params, ids, weights, stream_);
}
void CudaBackend::moe_experts_impl(const Tensor& x, const Tensor& ids, const Tensor& weights,
                                   std::span<const MoeExpert> experts, Tensor& out, int64_t first_expert) {
  // bf16 experts are batch invariant as they are: every tile size sums a
  // row's products in the same K order on the same MMA (moe.h).
  if (experts[0].gate.block_fp8()) check_fp8_invariance("moe_experts");
  if (fp8_compute_ == Fp8Compute::kW8A16 && experts[0].gate.block_fp8()) {
    // The span's bf16 copy, made once (mixed spans keep their non-FP8
    // matrices as they are; the table picks the path for the result).
    const std::pair<const void*, size_t> key{experts[0].gate.weight.raw(), experts.size()};
    auto it = dequantized_experts_.find(key);
    if (it == dequantized_experts_.end()) {
      std::vector<MoeExpert> copy;
      copy.reserve(experts.size());
      auto plain = [&](const LinearWeight& w) {
        return w.block_fp8() ? LinearWeight{dequantized_->bf16(w, "moe_experts"), Tensor()} : w;
      };
      for (const MoeExpert& e : experts) copy.push_back(MoeExpert{plain(e.gate), plain(e.up), plain(e.down)});
      it = dequantized_experts_.emplace(key, std::move(copy)).first;
    }
    experts = it->second;
  }
  const MoeExpertTable& table = moe_tables_->get(experts, stream_);
  // Bytes: x, out, routing, and the weights of as many experts as the call
  // can touch (min(E, T k): which ones is only known on the device).
  const double pairs = static_cast<double>(ids.numel());
  double expert_bytes = 0;
  for (const LinearWeight* w : {&experts[0].gate, &experts[0].up, &experts[0].down})
    expert_bytes += static_cast<double>(w->weight.nbytes() + w->scale_inv.nbytes());
  const double touched = std::min(static_cast<double>(experts.size()), pairs);
  const double flops = 6.0 * pairs * static_cast<double>(table.hidden) * static_cast<double>(table.inter);
  const OpScope scope(*this, "moe_experts", bytes_of({&x, &ids, &weights, &out}) + touched * expert_bytes, flops);
  MoeOptions options;
  options.first_expert = static_cast<int32_t>(std::max<int64_t>(first_expert, 0));
  cuda_moe_experts(x, ids, weights, table, out, stream_, options);
}
void CudaBackend::mla_store_kv_impl(const Tensor& kv_a, const Tensor& norm_weight, float eps,
                                    const Tensor& positions, const RopeParams& rope,
                                    const Tensor& slots, Tensor& cache) {
  const double row = cache.rank() == 2 ? static_cast<double>(cache.dim(1) * dtype_size(cache.dtype())) : 0;
  const OpScope scope(*this, "mla_store_kv",
                      bytes_of({&kv_a, &norm_weight, &positions, &slots}) + row * static_cast<double>(slots.numel()));
  mla_->store_kv(kv_a, norm_weight, eps, positions, rope, slots, cache);
}
void CudaBackend::mla_attention_impl(const Tensor& q, const Tensor& cache, const LinearWeight& kv_b,
                                     const AttentionLayout& layout, const MlaParams& params,
                                     Tensor& out) {
  // Every cached row the layout names is read once, and kv_b once.
  const double row = cache.rank() == 2 ? static_cast<double>(cache.dim(1) * dtype_size(cache.dtype())) : 0;
  const OpScope scope(*this, "mla_attention",
                      bytes_of({&q, &out, &layout.kv_slots, &kv_b.weight}) +
                          row * static_cast<double>(layout.kv_slots.numel()));
  mla_->attention(q, cache, kv_b, layout, params, out);
}
void CudaBackend::mla_expand_kv_impl(const Tensor& cache, const Tensor& slots,
                                     const LinearWeight& kv_b, const MlaParams& params, Tensor& k,
                                     Tensor& v) {
  const double row = cache.rank() == 2 ? static_cast<double>(cache.dim(1) * dtype_size(cache.dtype())) : 0;
  const OpScope scope(*this, "mla_expand_kv",
                      bytes_of({&slots, &kv_b.weight, &k, &v}) + row * static_cast<double>(slots.numel()));
  mla_->expand_kv(cache, slots, kv_b, params, k, v);
}

void CudaBackend::concat_columns_impl(const Tensor& a, const Tensor& b, Tensor& out) {
  BASALT_CHECK(a.device() == Device::kCuda && b.device() == Device::kCuda && out.device() == Device::kCuda &&
                   a.rank() == 2 && b.rank() == 2 && out.rank() == 2 && a.dtype() == out.dtype() &&
                   b.dtype() == out.dtype() && a.dim(0) == out.dim(0) && b.dim(0) == out.dim(0) &&
                   a.dim(1) + b.dim(1) == out.dim(1),
               "cuda concat_columns: {} | {} into {}", a.describe(), b.describe(), out.describe());
  const size_t e = dtype_size(out.dtype());
  const size_t pitch = static_cast<size_t>(out.dim(1)) * e;
  const size_t rows = static_cast<size_t>(out.dim(0));
  if (rows == 0) return;
  if (a.dim(1) > 0)
    BASALT_CUDA_CHECK(cudaMemcpy2DAsync(out.raw(), pitch, a.raw(), static_cast<size_t>(a.dim(1)) * e,
                                        static_cast<size_t>(a.dim(1)) * e, rows, cudaMemcpyDeviceToDevice, stream_));
  if (b.dim(1) > 0)
    BASALT_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(out.raw()) + static_cast<size_t>(a.dim(1)) * e, pitch,
                                        b.raw(), static_cast<size_t>(b.dim(1)) * e, static_cast<size_t>(b.dim(1)) * e,
                                        rows, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::moe_combine_impl(const Tensor& rows, const Tensor& positions, const Tensor& weights, Tensor& out) {
  const OpScope scope(*this, "moe_combine", bytes_of({&positions, &weights, &out}) + static_cast<double>(out.nbytes()) *
                                                static_cast<double>(positions.dim(1)));
  cuda_moe_combine(rows, positions, weights, out, stream_);
}

}  // namespace basalt

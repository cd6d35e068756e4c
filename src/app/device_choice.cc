#include "app/device_choice.h"

#include "backend/cpu/cpu_backend.h"
#include "runtime/kv_pool.h"
#include "core/error.h"
#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#ifdef BASALT_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#endif

namespace basalt {

std::unique_ptr<Backend> make_backend(const std::string& device, int threads) {
  BASALT_CHECK(threads >= 0 && threads <= 4096, "--threads must be in [0, 4096], got {}", threads);
  if (threads == 0) {
    if (const char* env = std::getenv("BASALT_NUM_THREADS"); env != nullptr && *env != '\0') {
      char* end = nullptr;
      const long n = std::strtol(env, &end, 10);
      BASALT_CHECK(*end == '\0' && n >= 1 && n <= 4096,
                   "BASALT_NUM_THREADS='{}' is not a thread count (an integer in [1, 4096])", env);
    }
  }
  if (device == "cpu") {
    if (threads > 0)
      BASALT_CHECK(ThreadPool::set_global_threads(threads),
                   "--threads {}: the CPU thread pool already runs with {} threads", threads,
                   ThreadPool::global().size());
    return std::make_unique<CpuBackend>();
  }
  if (device == "cuda") {
#ifdef BASALT_HAVE_CUDA
    return std::make_unique<CudaBackend>();
#else
    fail("--device cuda: this build has no CUDA backend (build where nvcc is found, or with -DBASALT_CUDA=ON)");
#endif
  }
  fail("--device {}: unknown device (this build has: {})", device, available_devices());
}

void check_fp8_compute(const std::string& choice, const std::string& device) {
  BASALT_CHECK(choice == "auto" || choice == "w8a8" || choice == "w8a16",
               "--fp8-compute {}: expected auto, w8a8 or w8a16", choice);
  BASALT_CHECK(!(choice == "w8a8" && device == "cpu"),
               "--fp8-compute w8a8 --device cpu: the CPU backend multiplies FP8 weights by unquantized activations "
               "(w8a16) only");
}

void apply_fp8_compute(const std::string& choice, Backend& backend) {
  check_fp8_compute(choice, std::string(backend.name()));
  if (choice == "auto") return;
  backend.set_fp8_compute(choice == "w8a8" ? Fp8Compute::kW8A8 : Fp8Compute::kW8A16);
}

void check_batch_invariant(bool on, const std::string& fp8_choice, const std::string& device,
                           bool tensor_parallel) {
  BASALT_CHECK(!on || fp8_choice != "w8a8",
               "--batch-invariant --fp8-compute w8a8: the FP8 GEMMs choose their kernels by row count, so the "
               "batch-invariant mode multiplies FP8 weights as w8a16 (leave --fp8-compute at auto or say w8a16)");
  BASALT_CHECK(!on || device == "cpu" || !tensor_parallel,
               "--batch-invariant --tp N --device {}: NCCL's all-reduce sums each element in an order that depends "
               "on the message's size, so tensor-parallel GPU ranks are not batch invariant (--dp-attention ranks "
               "are: they exchange rows, not sums)",
               device);
}

void apply_batch_invariant(bool on, const std::string& fp8_choice, Backend& backend) {
  check_batch_invariant(on, fp8_choice, std::string(backend.name()), false);
  if (!on) return;
  backend.set_batch_invariant(true);
  backend.set_fp8_compute(Fp8Compute::kW8A16);
}

void check_dtype(const std::string& choice, const std::string& device) {
  BASALT_CHECK(choice == "auto" || choice == "bfloat16" || choice == "float32",
               "--dtype {}: expected auto, bfloat16 or float32", choice);
  BASALT_CHECK(!(choice == "float32" && device != "cpu"),
               "--dtype float32 --device {}: only the CPU backend multiplies bf16 weights by f32 activations",
               device);
}

void apply_dtype(const std::string& choice, Backend& backend) {
  check_dtype(choice, std::string(backend.name()));
  if (auto* cpu = dynamic_cast<CpuBackend*>(&backend))
    cpu->set_bf16_activations(choice == "auto"       ? cpu::auto_bf16_activations()
                              : choice == "float32" ? cpu::Bf16Activations::kF32
                                                    : cpu::Bf16Activations::kRounded);
}

cpu::Bf16Activations cpu_bf16_activations(const Backend& backend) {
  const auto* cpu = dynamic_cast<const CpuBackend*>(&backend);
  return cpu != nullptr ? cpu->bf16_activations() : cpu::Bf16Activations::kRounded;
}

size_t kv_budget_bytes(const std::string& device, double fraction) {
#ifdef BASALT_HAVE_CUDA
  if (device == "cuda")
    return static_cast<size_t>(static_cast<double>(cuda_free_memory()) * (fraction > 0 ? fraction : 0.8));
#endif
  return KvPool::host_memory_budget(fraction > 0 ? fraction : 0.1);
}

DType kv_cache_dtype(const std::string& choice, const Backend& backend) {
  if (choice == "auto") return backend.device() == Device::kCpu ? DType::kF32 : DType::kBF16;
  if (choice == "bf16") return DType::kBF16;
  if (choice == "f32") return DType::kF32;
  fail("--kv-cache-dtype {}: expected auto, bf16 or f32", choice);
}

bool jump_forward_choice(bool on, bool off, const Backend& backend) {
  BASALT_CHECK(!(on && off), "--jump-forward and --no-jump-forward: give at most one");
  if (on || off) return on;
  return backend.device() != Device::kCpu;
}

int adaptive_drafts_from_batch(const Backend& backend) { return backend.device() == Device::kCpu ? 1 : 16; }

const char* available_devices() {
#ifdef BASALT_HAVE_CUDA
  return "cpu, cuda";
#else
  return "cpu";
#endif
}

std::unique_ptr<Backend> make_flagged_backend(const std::string& device, int threads, const std::string& fp8_compute,
                                              bool batch_invariant, const std::string& dtype) {
  std::unique_ptr<Backend> backend = make_backend(device, threads);
  apply_fp8_compute(fp8_compute, *backend);
  apply_batch_invariant(batch_invariant, fp8_compute, *backend);
  apply_dtype(dtype, *backend);
  return backend;
}

}  // namespace basalt

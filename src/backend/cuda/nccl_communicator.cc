#include "backend/cuda/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <numeric>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace basalt {
namespace {

#define BASALT_NCCL_CHECK(call)                                                               \
  do {                                                                                        \
    const ncclResult_t status_ = (call);                                                      \
    if (status_ != ncclSuccess)                                                               \
      ::basalt::fail("NCCL: {} failed: {} ({}:{})", #call, ncclGetErrorString(status_), __FILE__, __LINE__); \
  } while (0)

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    default: return ncclUint8;  // moved as bytes
  }
}

// Elements NCCL moves for t: its numel, or its bytes for dtypes moved as bytes.
size_t nccl_count(const Tensor& t) {
  return nccl_type(t.dtype()) == ncclUint8 ? t.nbytes() : static_cast<size_t>(t.numel());
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, CudaBackend& backend, int rank, int world)
      : comm_(comm), backend_(backend), rank_(rank), world_(world) {}
  ~NcclCommunicator() override { (void)ncclCommDestroy(comm_); }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  bool can_record() const override { return true; }

  void all_reduce(Tensor& x, ReduceOp op) override {
    check_all_reduce(x, "nccl");
    require_device(x);
    backend_.make_current();
    BASALT_NCCL_CHECK(ncclAllReduce(x.raw(), x.raw(), static_cast<size_t>(x.numel()), nccl_type(x.dtype()),
                                    op == ReduceOp::kSum ? ncclSum : ncclMax, comm_, backend_.stream()));
  }

  void all_gather(const Tensor& x, Tensor& out) override {
    check_all_gather(x, out, world_, "nccl");
    require_device(x);
    require_device(out);
    backend_.make_current();
    BASALT_NCCL_CHECK(ncclAllGather(x.raw(), out.raw(), nccl_count(x), nccl_type(x.dtype()), comm_, backend_.stream()));
  }

  void reduce_scatter(const Tensor& x, Tensor& out, ReduceOp op) override {
    check_reduce_scatter(x, out, world_, "nccl");
    require_device(x);
    require_device(out);
    backend_.make_current();
    BASALT_NCCL_CHECK(ncclReduceScatter(x.raw(), out.raw(), static_cast<size_t>(out.numel()), nccl_type(x.dtype()),
                                        op == ReduceOp::kSum ? ncclSum : ncclMax, comm_, backend_.stream()));
  }

  void all_to_all(const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                  std::span<const int64_t> recv_rows) override {
    check_all_to_all(send, send_rows, recv, recv_rows, world_, "nccl");
    require_device(send);
    require_device(recv);
    backend_.make_current();
    const size_t row_bytes = send.dim(0) > 0 ? send.nbytes() / static_cast<size_t>(send.dim(0))
                                             : recv.dim(0) > 0 ? recv.nbytes() / static_cast<size_t>(recv.dim(0)) : 0;
    BASALT_NCCL_CHECK(ncclGroupStart());
    size_t sent = 0, received = 0;
    for (int r = 0; r < world_; ++r) {
      const size_t out_bytes = static_cast<size_t>(send_rows[static_cast<size_t>(r)]) * row_bytes;
      const size_t in_bytes = static_cast<size_t>(recv_rows[static_cast<size_t>(r)]) * row_bytes;
      if (out_bytes > 0)
        BASALT_NCCL_CHECK(ncclSend(static_cast<const char*>(send.raw()) + sent, out_bytes, ncclUint8, r, comm_,
                                   backend_.stream()));
      if (in_bytes > 0)
        BASALT_NCCL_CHECK(ncclRecv(static_cast<char*>(recv.raw()) + received, in_bytes, ncclUint8, r, comm_,
                                   backend_.stream()));
      sent += out_bytes;
      received += in_bytes;
    }
    BASALT_NCCL_CHECK(ncclGroupEnd());
  }

  void broadcast(Tensor& x, int root) override {
    check_broadcast(root, world_, "nccl");
    require_device(x);
    backend_.make_current();
    BASALT_NCCL_CHECK(
        ncclBroadcast(x.raw(), x.raw(), nccl_count(x), nccl_type(x.dtype()), root, comm_, backend_.stream()));
  }

 private:
  static void require_device(const Tensor& t) {
    BASALT_CHECK(t.device() == Device::kCuda, "nccl communicator: {} is not on the GPU", t.describe());
  }

  ncclComm_t comm_;
  CudaBackend& backend_;
  int rank_, world_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_group(std::span<CudaBackend* const> backends) {
  BASALT_CHECK(!backends.empty(), "an NCCL group needs at least one GPU");
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  const int world = static_cast<int>(backends.size());
  std::vector<int> devices;
  for (CudaBackend* b : backends) devices.push_back(b->ordinal());
  std::vector<ncclComm_t> comms(static_cast<size_t>(world));
  BASALT_NCCL_CHECK(ncclCommInitAll(comms.data(), world, devices.data()));
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < world; ++r)
    out.push_back(std::make_unique<NcclCommunicator>(comms[static_cast<size_t>(r)], *backends[static_cast<size_t>(r)],
                                                     r, world));
  return out;
}

}  // namespace basalt
